package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/shard"
)

// DLQ lists, shows and re-drives one scope's dead letters.
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
// refused and reported, and the command exits 1.
func DLQ(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
	for i, a := range args {
		if a == "-deliveries" || a == "--deliveries" {
			return deliveryDLQ(ctx, slices.Delete(slices.Clone(args), i, i+1), env, stdout, stderr)
		}
	}
	fs := cli.NewFlagSet("jetinbox dlq", "List one scope's dead letters with counts by reason (the default), -show one, or -redrive a selection\n"+
		"after fixing the cause: each intent is published again with its original ID so the inbox decides again\n"+
		"(its rejected inbox row is deleted first; an applied ID stays applied). What is published is the original read back\n"+
		"from the intents stream at the dead letter's stream sequence; a dead letter whose original is gone or is another\n"+
		"message there is refused. Exit 0 ok, 1 failure or a refused dead letter, 2 usage error.", stderr)
	var nf cli.NATSFlags
	nf.Register(fs, env)
	dbURL := cli.DatabaseFlag(fs, env, cli.DatabaseUsage)
	stream := cli.StreamFlag(fs, env, "intents stream (its dead letters are in <stream>_DLQ)")
	scope := cli.ScopeFlag(fs, env)
	show := fs.Uint64("show", 0, "print the dead letter at this sequence of the dead-letter stream: headers and payload")
	redrive := fs.Bool("redrive", false, "re-drive the selected dead letters (-all, -id, -seq or -reason)")
	all := fs.Bool("all", false, "select every dead letter of the scope")
	ids := fs.String("id", "", "select by original message ID (comma-separated)")
	seqs := fs.String("seq", "", "select by dead-letter stream sequence (comma-separated)")
	reason := fs.String("reason", "", "select the dead letters whose reason contains this text")
	var sf cli.ShardFlags
	sf.Register(fs, env)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var shards *shard.Map
	if sf.File != "" {
		// A sharded stream: its stream and scope come from the map, and a
		// re-drive goes to the shard that owns the ID's partition now.
		m, _, err := sf.Load(false)
		if err != nil {
			return err
		}
		shards = m
		*stream, *scope = shards.Stream, shards.Scope
	}
	if fs.NArg() > 0 {
		return cli.UsageError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	sel, err := newSelection(*all, *ids, *seqs, *reason)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	if *redrive && sel.empty() {
		return cli.UsageError{Err: errors.New("-redrive needs a selection: -all, -id, -seq or -reason")}
	}
	if err := nf.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	if err := cli.CheckScope(*scope); err != nil {
		return err
	}
	log := cli.EnvLogger(stderr, env, slog.LevelInfo)
	nc, js, err := nf.Connect("jetinbox-dlq", cli.DefaultReconnect(), log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer nc.Close()
	dead, err := readDeadLetters(ctx, js, *stream, *scope)
	if err != nil {
		return err
	}
	if *show != 0 {
		for _, d := range dead {
			if d.seq == *show {
				d.print(stdout)
				return nil
			}
		}
		return fmt.Errorf("dlq: no dead letter of scope %q at sequence %d of %s", *scope, *show, jsinbox.DeadLetterStream(*stream))
	}
	picked := dead
	if !sel.empty() {
		picked = picked[:0:0]
		for _, d := range dead {
			if sel.match(d) {
				picked = append(picked, d)
			}
		}
	}
	if !*redrive {
		listDeadLetters(stdout, dead, picked, *stream, *scope)
		return nil
	}
	if shards != nil {
		route, closeAll, err := shardRoute(ctx, shards, env, log)
		if err != nil {
			return err
		}
		defer closeAll()
		return redriveAll(ctx, stdout, js, nil, route, *stream, *scope, picked)
	}
	if err := cli.RequireDatabase(*dbURL); err != nil {
		return err
	}
	store, err := cli.OpenStore(ctx, *dbURL, 2, log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer store.Close()
	// A re-drive deletes rejected inbox rows: refuse a database that
	// cannot take that before anything is published.
	if err := store.CheckWritable(ctx); err != nil {
		return fmt.Errorf("dlq: %w", err)
	}
	return redriveAll(ctx, stdout, js, store, nil, *stream, *scope, picked)
}

// deadLetter is one dead letter of the scope, as the dead-letter stream
// holds it.
type deadLetter struct {
	seq            uint64 // in the dead-letter stream
	id, status     string
	reason         string
	subject        string // the original's
	origSeq        uint64
	deliveries     string
	header         nats.Header
	payload        []byte
	deadLetteredAt time.Time
	// original is the intent as the intents stream holds it at origSeq,
	// read before a re-drive (see readOriginal).
	original *jetstream.RawStreamMsg
}

func (d deadLetter) print(w io.Writer) {
	fmt.Fprintf(w, "dead letter %d of intent %q (stream seq %d, subject %s), %s after %s deliveries, at %s\nreason: %s\n",
		d.seq, d.id, d.origSeq, d.subject, d.status, d.deliveries, d.deadLetteredAt.Format(time.RFC3339), d.reason)
	keys := make([]string, 0, len(d.header))
	for k := range d.header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "%s: %s\n", k, strings.Join(d.header[k], ", "))
	}
	fmt.Fprintf(w, "\n%s\n", d.payload)
}

// readDeadLetters reads the scope's dead letters of stream with an ordered
// consumer, which disturbs nobody.
func readDeadLetters(ctx context.Context, js jetstream.JetStream, stream, scope string) ([]deadLetter, error) {
	name := jsinbox.DeadLetterStream(stream)
	if _, err := js.Stream(ctx, stream); err != nil {
		return nil, streamMissing("dlq", stream, err)
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
	var out []deadLetter
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
		out = append(out, deadLetter{seq: seq, id: h.Get(jsinbox.HeaderMessageID), status: h.Get(jsinbox.HeaderStatus),
			reason: h.Get(jsinbox.HeaderReason), subject: subject,
			origSeq: orig, deliveries: h.Get(jsinbox.HeaderDelivered), header: h, payload: m.Data(), deadLetteredAt: md.Timestamp})
	}
	return out, nil
}

// selection picks dead letters by ID, dead-letter sequence or reason.
type selection struct {
	all    bool
	ids    map[string]bool
	seqs   map[uint64]bool
	reason string
}

func newSelection(all bool, ids, seqs, reason string) (selection, error) {
	s := selection{all: all, reason: reason}
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

func (s selection) empty() bool { return !s.all && s.ids == nil && s.seqs == nil && s.reason == "" }

func (s selection) match(d deadLetter) bool {
	return s.all || s.ids[d.id] || s.seqs[d.seq] || (s.reason != "" && strings.Contains(d.reason, s.reason))
}

// listDeadLetters prints counts by reason over every dead letter of the
// scope, then the selected ones (all of them without a selection).
func listDeadLetters(w io.Writer, dead, picked []deadLetter, stream, scope string) {
	fmt.Fprintf(w, "%d dead letters of scope %q in %s\n", len(dead), scope, jsinbox.DeadLetterStream(stream))
	if len(dead) == 0 {
		return
	}
	counts := map[string]int{}
	for _, d := range dead {
		counts[d.status+"\t"+shorten(d.reason, 80)]++
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
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", d.seq, d.id, d.origSeq, d.status, shorten(d.reason, 60))
	}
	tw.Flush()
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// redriveAll re-drives each picked dead letter once per intent ID.
func redriveAll(ctx context.Context, w io.Writer, js jetstream.JetStream, store *cli.Store, route redriveRoute, stream, scope string, picked []deadLetter) error {
	var sent, applied, skipped, refused, failed int
	done := map[string]bool{}
	for _, d := range picked {
		if d.status == jsinbox.DeadLetterExpired {
			skipped++
			fmt.Fprintf(w, "dead letter %d: %s\n", d.seq, expiredNote(d))
			continue
		}
		if done[d.id] {
			continue
		}
		if d.status == inbox.StatusConflict.String() {
			done[d.id] = true
			skipped++
			fmt.Fprintf(w, "%s: a conflict: the ID is applied with another payload; publish the intent under a new ID instead\n", d.id)
			continue
		}
		orig, why, err := readOriginal(ctx, js, stream, d)
		switch {
		case err != nil:
			failed++
			fmt.Fprintf(w, "dead letter %d (intent %q): %v\n", d.seq, d.id, err)
			continue
		case why != "":
			// Not marked done: another dead letter of the ID may name
			// its original rightly.
			refused++
			fmt.Fprintf(w, "dead letter %d (intent %q): refused, not re-driven: %s\n", d.seq, d.id, why)
			continue
		}
		done[d.id] = true
		d.original = orig
		st := store
		if route != nil {
			var why string
			if st, d, why = route(d); why != "" {
				skipped++
				fmt.Fprintf(w, "%s: %s\n", d.id, why)
				continue
			}
		}
		switch res, err := redrive(ctx, js, st, stream, scope, d); {
		case err != nil:
			failed++
			fmt.Fprintf(w, "%s: %v\n", d.id, err)
		case res == "":
			sent++
		case res == "applied":
			applied++
			fmt.Fprintf(w, "%s: already applied; not published again\n", d.id)
		default:
			skipped++
			fmt.Fprintf(w, "%s: %s\n", d.id, res)
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
func readOriginal(ctx context.Context, js jetstream.JetStream, stream string, d deadLetter) (*jetstream.RawStreamMsg, string, error) {
	if d.origSeq == 0 {
		return nil, fmt.Sprintf("it names no stream sequence of %s to read the original from", stream), nil
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, "", fmt.Errorf("stream %s: %w", stream, err)
	}
	raw, err := s.GetMsg(ctx, d.origSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// A direct get may be answered by a replica that lags; the
		// stream's leader says whether the sequence is really gone.
		info, ierr := s.Info(ctx)
		if ierr != nil {
			return nil, "", fmt.Errorf("stream %s: %w", stream, ierr)
		}
		switch {
		case d.origSeq > info.State.LastSeq:
			return nil, fmt.Sprintf("stream seq %d is beyond the last message %s ever held (%d): it names no original", d.origSeq, stream, info.State.LastSeq), nil
		case d.origSeq < info.State.FirstSeq:
			return nil, fmt.Sprintf("the original at stream seq %d is gone from %s (aged out, max_age %s): nothing is kept to re-drive; "+
				"find the intent at its producer (publishing it again with its ID is safe)", d.origSeq, stream, info.Config.MaxAge), nil
		}
		return nil, "", fmt.Errorf("stream %s: seq %d could not be read (a replica behind its leader?); try again: %w", stream, d.origSeq, err)
	}
	if err != nil {
		return nil, "", fmt.Errorf("read the original at stream seq %d of %s: %w", d.origSeq, stream, err)
	}
	if id := raw.Header.Get(jetstream.MsgIDHeader); id != d.id {
		return nil, fmt.Sprintf("stream seq %d holds intent %q, not %q: the dead letter does not describe the message it names (written by someone other than a consumer?)",
			d.origSeq, id, d.id), nil
	}
	if raw.Subject != d.subject {
		return nil, fmt.Sprintf("stream seq %d holds intent %q on subject %q, not %q: the dead letter does not describe the message it names (written by someone other than a consumer?)",
			d.origSeq, d.id, raw.Subject, d.subject), nil
	}
	return raw, "", nil
}

// expiredNote says why an expired record cannot be re-driven.
func expiredNote(d deadLetter) string {
	return fmt.Sprintf("stream seq %d expired before rescue: the server gave up on it and it aged out of the stream before a consumer could rescue it; "+
		"nothing is kept to re-drive (find the intent at its producer; publishing it again with its ID is safe)", d.origSeq)
}

// redriveRoute picks the store a dead letter is re-driven through and the
// subject it is published on, or says why it is skipped.
type redriveRoute func(deadLetter) (*cli.Store, deadLetter, string)

// shardRoute routes a sharded stream's dead letters: each to the shard
// whose database owns its ID's partition now, published on the subject of
// its ID's key (the stored subject carries a partition token the stream's
// transform would add again, and a copy published under another key than
// its ID's would be refused again).
func shardRoute(ctx context.Context, m *shard.Map, env cli.Env, log *slog.Logger) (redriveRoute, func(), error) {
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
	return func(d deadLetter) (*cli.Store, deadLetter, string) {
		ps, err := shard.ParseStored(m.Subject, d.subject)
		if err != nil {
			return nil, d, "not a subject of the sharded stream: " + err.Error()
		}
		st := owner[shard.PartitionOf(d.id, m.Partitions)]
		if st == nil {
			return nil, d, fmt.Sprintf("partition %d of the ID is owned by no shard now (a move halfway?): run jetinbox partitions list", shard.PartitionOf(d.id, m.Partitions))
		}
		d.subject = shard.PublishSubject(m.Subject, d.id, ps.Rest)
		return st, d, ""
	}, closeAll, nil
}

// redrive deletes the intent's rejected inbox row and publishes the
// original read from the stream (d.original) again with its ID. It returns "" when published, "applied" when the
// ID is applied (nothing published), or why it skipped the dead letter.
func redrive(ctx context.Context, js jetstream.JetStream, store *cli.Store, stream, scope string, d deadLetter) (string, error) {
	if d.status == inbox.StatusConflict.String() {
		return "a conflict: the ID is applied with another payload; publish the intent under a new ID instead", nil
	}
	if d.id == "" || d.subject == "" {
		return "no valid ID or subject to publish under (a subject longer than the inbox takes is not kept)", nil
	}
	status, err := store.ReleaseRejected(ctx, scope, d.id)
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
	ack, err := js.PublishMsg(pctx, &nats.Msg{Subject: d.subject, Data: orig.Data, Header: h},
		jetstream.WithMsgID(d.id), jetstream.WithExpectStream(stream))
	if err != nil {
		return "", fmt.Errorf("publish: %w", err)
	}
	if ack.Duplicate {
		return fmt.Sprintf("the stream still remembers the ID (its duplicate window): the copy was dropped; re-drive again once the window has passed (stream seq %d)", ack.Sequence), nil
	}
	return "", nil
}
