// Package dlq reads a scope's dead letters and re-drives them: the one
// implementation behind `jetinbox dlq` and the console's dead-letter pages.
//
// A re-drive publishes the dead letter's original intent again, with its
// original ID, subject and payload, into the intents stream, so that the
// inbox decides again: a rejected inbox row of that ID is deleted first
// (an applied one stays, and the intent is not published). Conflicts are
// not re-driven: their ID is applied with another payload.
//
// What is published is the original as the intents stream holds it, read
// by the stream sequence the dead letter names, never the dead letter's
// own copy: a key that may publish dead letters (every consumer's) could
// otherwise have any intent applied by writing one. A dead letter whose
// sequence holds another ID or subject, or nothing any more (aged out), is
// refused and reported.
package dlq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/shard"
)

// streamMissing explains a missing intents stream.
func streamMissing(stream string, err error) error {
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	return fmt.Errorf("dlq: stream %s not found on this server: check -stream (JETINBOX_STREAM) and the server or "+
		"context you connected to; the producer creates it, or nats stream add %s --config deploy/jetstream/intents-stream.json: %w",
		stream, stream, err)
}

// Letter is one dead letter of a scope, as the dead-letter stream
// holds it.
type Letter struct {
	// Seq is the dead letter's sequence in the dead-letter stream.
	Seq uint64
	// ID and Status are the original's message ID and the dead letter's
	// status (rejected, conflict, expired, ...).
	ID, Status string
	// Reason says why it was dead-lettered, as the consumer wrote it.
	Reason string
	// Subject is the original's subject.
	Subject string
	// OrigSeq is the original's sequence in the intents stream.
	OrigSeq uint64
	// Deliveries is how often the original was delivered, as the
	// consumer's header says.
	Deliveries string
	// Header and Payload are the dead letter's own, as the stream holds
	// them: hostile input to whoever shows them.
	Header  nats.Header
	Payload []byte
	// DeadLetteredAt is when the dead letter was stored.
	DeadLetteredAt time.Time
	// original is the intent as the intents stream holds it at origSeq,
	// read before a re-drive (see readOriginal).
	original *jetstream.RawStreamMsg
}

// Print writes the dead letter whole, for people.
func (d Letter) Print(w io.Writer) {
	fmt.Fprintf(w, "dead letter %d of intent %q (stream seq %d, subject %s), %s after %s deliveries, at %s\nreason: %s\n",
		d.Seq, d.ID, d.OrigSeq, d.Subject, d.Status, d.Deliveries, d.DeadLetteredAt.Format(time.RFC3339), d.Reason)
	keys := make([]string, 0, len(d.Header))
	for k := range d.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "%s: %s\n", k, strings.Join(d.Header[k], ", "))
	}
	fmt.Fprintf(w, "\n%s\n", d.Payload)
}

// Read reads the scope's dead letters of stream with an ordered
// consumer, which disturbs nobody.
func Read(ctx context.Context, js jetstream.JetStream, stream, scope string) ([]Letter, error) {
	name := jsinbox.DeadLetterStream(stream)
	if _, err := js.Stream(ctx, stream); err != nil {
		return nil, streamMissing(stream, err)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("dlq: dead-letter stream %s not found: no consumer of %s has dead-lettered "+
				"anything yet, or the server was set up without it (nats stream add %s --config deploy/jetstream/dlq-stream.json): %w",
				name, stream, name, err)
		}
		return nil, fmt.Errorf("dlq: %s: %w", name, err)
	}
	total := s.CachedInfo().State.Msgs
	if total == 0 {
		return nil, nil
	}
	c, err := js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("dlq: read %s: %w", name, err)
	}
	last := s.CachedInfo().State.LastSeq
	// Pulled continuously: nats.go restarts the ordered consumer on a
	// server that lost it, which a Fetch per batch does not.
	it, err := c.Messages(jetstream.PullMaxMessages(500))
	if err != nil {
		return nil, fmt.Errorf("dlq: read %s: %w", name, err)
	}
	defer it.Stop()
	var out []Letter
	for seq := uint64(0); seq < last; {
		nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("dlq: read %s: stopped at sequence %d of %d: %w", name, seq, last, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("dlq: read %s: %w", name, err)
		}
		seq = md.Sequence.Stream
		h := m.Headers()
		if h.Get(jsinbox.HeaderScope) != scope || h.Get(jsinbox.HeaderStream) != stream {
			continue
		}
		orig, _ := strconv.ParseUint(h.Get(jsinbox.HeaderStreamSeq), 10, 64)
		subject, _ := jsinbox.OriginalSubject(&nats.Msg{Subject: m.Subject(), Header: h})
		out = append(out, Letter{Seq: seq, ID: h.Get(jsinbox.HeaderMessageID), Status: h.Get(jsinbox.HeaderStatus),
			Reason: h.Get(jsinbox.HeaderReason), Subject: subject,
			OrigSeq: orig, Deliveries: h.Get(jsinbox.HeaderDelivered), Header: h, Payload: m.Data(), DeadLetteredAt: md.Timestamp})
	}
	return out, nil
}

// Selection picks dead letters by ID, dead-letter sequence or reason.
type Selection struct {
	all    bool
	ids    map[string]bool
	seqs   map[uint64]bool
	reason string
}

// NewSelection selects every dead letter (all), or those of the
// comma-separated IDs, the comma-separated dead-letter sequences, or whose
// reason contains reason.
func NewSelection(all bool, ids, seqs, reason string) (Selection, error) {
	s := Selection{all: all, reason: reason}
	if ids != "" {
		s.ids = map[string]bool{}
		for id := range strings.SplitSeq(ids, ",") {
			s.ids[strings.TrimSpace(id)] = true
		}
	}
	if seqs != "" {
		s.seqs = map[uint64]bool{}
		for f := range strings.SplitSeq(seqs, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil || n == 0 {
				return s, fmt.Errorf("-seq: %q is not a stream sequence", f)
			}
			s.seqs[n] = true
		}
	}
	return s, nil
}

// Empty reports whether nothing is selected.
func (s Selection) Empty() bool { return !s.all && s.ids == nil && s.seqs == nil && s.reason == "" }

// Match reports whether the selection picks d.
func (s Selection) Match(d Letter) bool {
	return s.all || s.ids[d.ID] || s.seqs[d.Seq] || (s.reason != "" && strings.Contains(d.Reason, s.reason))
}

// List prints counts by reason over every dead letter of the
// scope, then the selected ones (all of them without a selection).
func List(w io.Writer, dead, picked []Letter, stream, scope string) {
	fmt.Fprintf(w, "%d dead letters of scope %q in %s\n", len(dead), scope, jsinbox.DeadLetterStream(stream))
	if len(dead) == 0 {
		return
	}
	counts := map[string]int{}
	for _, d := range dead {
		counts[d.Status+"\t"+Shorten(d.Reason, 80)]++
	}
	reasons := make([]string, 0, len(counts))
	for r := range counts {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if counts[reasons[i]] != counts[reasons[j]] {
			return counts[reasons[i]] > counts[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\ncount\tstatus\treason")
	for _, r := range reasons {
		fmt.Fprintf(tw, "%d\t%s\n", counts[r], r)
	}
	fmt.Fprintln(tw, "\ndlq seq\tintent\tstream seq\tstatus\treason")
	for _, d := range picked {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", d.Seq, d.ID, d.OrigSeq, d.Status, Shorten(d.Reason, 60))
	}
	tw.Flush()
}

// Shorten cuts s to at most n bytes, at a character boundary, marking
// the cut with an ellipsis.
func Shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// Redrive re-drives each picked dead letter once per intent ID.
func Redrive(ctx context.Context, w io.Writer, js jetstream.JetStream, store *cli.Store, route Route, stream, scope string, picked []Letter) error {
	var sent, applied, skipped, refused, failed int
	done := map[string]bool{}
	for _, d := range picked {
		if d.Status == jsinbox.DeadLetterExpired {
			skipped++
			fmt.Fprintf(w, "dead letter %d: %s\n", d.Seq, expiredNote(d))
			continue
		}
		if done[d.ID] {
			continue
		}
		if d.Status == inbox.StatusConflict.String() {
			done[d.ID] = true
			skipped++
			fmt.Fprintf(w, "%s: a conflict: the ID is applied with another payload; publish the intent under a new ID instead\n", d.ID)
			continue
		}
		orig, why, err := readOriginal(ctx, js, stream, d)
		switch {
		case err != nil:
			failed++
			fmt.Fprintf(w, "dead letter %d (intent %q): %v\n", d.Seq, d.ID, err)
			continue
		case why != "":
			// Not marked done: another dead letter of the ID may name
			// its original rightly.
			refused++
			fmt.Fprintf(w, "dead letter %d (intent %q): refused, not re-driven: %s\n", d.Seq, d.ID, why)
			continue
		}
		done[d.ID] = true
		d.original = orig
		st := store
		if route != nil {
			var why string
			if st, d, why = route(d); why != "" {
				skipped++
				fmt.Fprintf(w, "%s: %s\n", d.ID, why)
				continue
			}
		}
		switch res, err := redriveOne(ctx, js, st, stream, scope, d); {
		case err != nil:
			failed++
			fmt.Fprintf(w, "%s: %v\n", d.ID, err)
		case res == "":
			sent++
		case res == "applied":
			applied++
			fmt.Fprintf(w, "%s: already applied; not published again\n", d.ID)
		default:
			skipped++
			fmt.Fprintf(w, "%s: %s\n", d.ID, res)
		}
	}
	fmt.Fprintf(w, "re-driven %d, already applied %d, skipped %d, refused %d, failed %d\n", sent, applied, skipped, refused, failed)
	switch {
	case failed > 0:
		return fmt.Errorf("dlq: %d re-drives failed, %d dead letters refused", failed, refused)
	case refused > 0:
		return fmt.Errorf("dlq: %d dead letters refused: the intents stream does not hold the original they name (gone, or another message there); nothing of theirs was published", refused)
	}
	return nil
}

// readOriginal reads the intent a dead letter stands for from the intents
// stream, at the stream sequence the dead letter names. It returns why the
// dead letter is refused ("" if not): no sequence, nothing there any more
// (aged out of the stream), or a message there whose ID or subject is not
// the dead letter's. Anyone who may publish dead letters can write one, so
// nothing but the stream's own copy is re-driven.
func readOriginal(ctx context.Context, js jetstream.JetStream, stream string, d Letter) (*jetstream.RawStreamMsg, string, error) {
	if d.OrigSeq == 0 {
		return nil, fmt.Sprintf("it names no stream sequence of %s to read the original from", stream), nil
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, "", fmt.Errorf("stream %s: %w", stream, err)
	}
	raw, err := s.GetMsg(ctx, d.OrigSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// A direct get may be answered by a replica that lags; the
		// stream's leader says whether the sequence is really gone.
		info, ierr := s.Info(ctx)
		if ierr != nil {
			return nil, "", fmt.Errorf("stream %s: %w", stream, ierr)
		}
		switch {
		case d.OrigSeq > info.State.LastSeq:
			return nil, fmt.Sprintf("stream seq %d is beyond the last message %s ever held (%d): it names no original", d.OrigSeq, stream, info.State.LastSeq), nil
		case d.OrigSeq < info.State.FirstSeq:
			return nil, fmt.Sprintf("the original at stream seq %d is gone from %s (aged out, max_age %s): nothing is kept to re-drive; "+
				"find the intent at its producer (publishing it again with its ID is safe)", d.OrigSeq, stream, info.Config.MaxAge), nil
		}
		return nil, "", fmt.Errorf("stream %s: seq %d could not be read (a replica behind its leader?); try again: %w", stream, d.OrigSeq, err)
	}
	if err != nil {
		return nil, "", fmt.Errorf("read the original at stream seq %d of %s: %w", d.OrigSeq, stream, err)
	}
	if id := raw.Header.Get(jetstream.MsgIDHeader); id != d.ID {
		return nil, fmt.Sprintf("stream seq %d holds intent %q, not %q: the dead letter does not describe the message it names (written by someone other than a consumer?)",
			d.OrigSeq, id, d.ID), nil
	}
	if raw.Subject != d.Subject {
		return nil, fmt.Sprintf("stream seq %d holds intent %q on subject %q, not %q: the dead letter does not describe the message it names (written by someone other than a consumer?)",
			d.OrigSeq, d.ID, raw.Subject, d.Subject), nil
	}
	return raw, "", nil
}

// expiredNote says why an expired record cannot be re-driven.
func expiredNote(d Letter) string {
	return fmt.Sprintf("stream seq %d expired before rescue: the server gave up on it and it aged out of the stream before a consumer could rescue it; "+
		"nothing is kept to re-drive (find the intent at its producer; publishing it again with its ID is safe)", d.OrigSeq)
}

// Route picks the store a dead letter is re-driven through and the
// subject it is published on, or says why it is skipped.
type Route func(Letter) (*cli.Store, Letter, string)

// ShardRoute routes a sharded stream's dead letters: each to the shard
// whose database owns its ID's partition now, published on the subject of
// its ID's key (the stored subject carries a partition token the stream's
// transform would add again, and a copy published under another key than
// its ID's would be refused again).
func ShardRoute(ctx context.Context, m *shard.Map, env cli.Env, log *slog.Logger) (Route, func(), error) {
	stores := make([]*cli.Store, 0, len(m.Shards))
	closeAll := func() {
		for _, s := range stores {
			s.Close()
		}
	}
	owner := map[int]*cli.Store{}
	for i := range m.Shards {
		st, err := cli.OpenShard(ctx, &m.Shards[i], env, 2, log)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		stores = append(stores, st)
		owned, err := shard.Owned(ctx, st.PG, m.Scope)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		for _, p := range owned {
			owner[p] = st
		}
	}
	return func(d Letter) (*cli.Store, Letter, string) {
		ps, err := shard.ParseStored(m.Subject, d.Subject)
		if err != nil {
			return nil, d, "not a subject of the sharded stream: " + err.Error()
		}
		st := owner[shard.PartitionOf(d.ID, m.Partitions)]
		if st == nil {
			return nil, d, fmt.Sprintf("partition %d of the ID is owned by no shard now (a move halfway?): run jetinbox partitions list", shard.PartitionOf(d.ID, m.Partitions))
		}
		d.Subject = shard.PublishSubject(m.Subject, d.ID, ps.Rest)
		return st, d, ""
	}, closeAll, nil
}

// redriveOne deletes the intent's rejected inbox row and publishes the
// original read from the stream (d.original) again with its ID. It returns "" when published, "applied" when the
// ID is applied (nothing published), or why it skipped the dead letter.
func redriveOne(ctx context.Context, js jetstream.JetStream, store *cli.Store, stream, scope string, d Letter) (string, error) {
	if d.Status == inbox.StatusConflict.String() {
		return "a conflict: the ID is applied with another payload; publish the intent under a new ID instead", nil
	}
	if d.ID == "" || d.Subject == "" {
		return "no valid ID or subject to publish under (a subject longer than the inbox takes is not kept)", nil
	}
	status, err := store.ReleaseRejected(ctx, scope, d.ID)
	if err != nil {
		return "", fmt.Errorf("inbox: %w", err)
	}
	if status == driver.RowApplied {
		return "applied", nil
	}
	// The original's bytes and headers, as the stream holds them; of
	// JetStream's own headers only its ID, which WithMsgID sets (an
	// expected-stream, TTL, rollup or batch header of the original publish
	// would refuse, expire or delete).
	orig := d.original
	if orig == nil {
		return "", errors.New("no original read from the intents stream")
	}
	h := nats.Header{}
	for k, v := range orig.Header {
		if strings.HasPrefix(strings.ToLower(k), "nats-") {
			continue
		}
		h[k] = v
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ack, err := js.PublishMsg(pctx, &nats.Msg{Subject: d.Subject, Data: orig.Data, Header: h},
		jetstream.WithMsgID(d.ID), jetstream.WithExpectStream(stream))
	if err != nil {
		return "", fmt.Errorf("publish: %w", err)
	}
	if ack.Duplicate {
		return fmt.Sprintf("the stream still remembers the ID (its duplicate window): the copy was dropped; re-drive again once the window has passed (stream seq %d)", ack.Sequence), nil
	}
	return "", nil
}
