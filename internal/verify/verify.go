// Package verify checks a pipeline's final state against its stream: it reads
// every message with an ordered consumer (disturbing no durable consumer),
// reads the dead-letter stream, the inbox and the ledger, and reports lost,
// duplicated and unexpected effects.
package verify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/effects"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// Options says what to check.
type Options struct {
	// Stream is the intents stream. Default "INTENTS".
	Stream string
	// Scope is the inbox scope: the identity of the effect checked. Inbox
	// rows, conflicts, dead letters and ledger entries of other scopes are
	// not judged. Default "ledger".
	Scope string
	// Durable, if set, is consulted for messages still pending and for its
	// redelivery settings. It has nothing to do with the scope.
	Durable string
	// Ledger checks the ledger effect: entries per message and balances.
	// Set false for other effects.
	Ledger bool
	// Range limits the check to part of the stream. Zero: all of it. With
	// a range, rows and effects of IDs outside it are not judged, and
	// balances are not checked.
	Range Range
	// Horizon settings to check against the stream and the durable.
	Horizon jsinbox.HorizonOptions
	// Progress, if set, is called as the stream is read.
	Progress func(read, total uint64)
}

// Range is a part of the stream, by sequence or time. Zero fields are open.
type Range struct {
	FromSeq, ToSeq   uint64
	FromTime, ToTime time.Time
}

// ErrBadRange is returned for a range that selects nothing by construction:
// reversed, or set by sequence and by time at once.
var ErrBadRange = errors.New("verify: bad range")

// Validate reports a reversed range (-from-seq after -to-seq, -from-time
// after -to-time) or a start given both by sequence and by time. A reversed
// range would read nothing and look clean.
func (r Range) Validate() error {
	switch {
	case r.FromSeq > 0 && r.ToSeq > 0 && r.FromSeq > r.ToSeq:
		return fmt.Errorf("%w: from sequence %d is after to sequence %d", ErrBadRange, r.FromSeq, r.ToSeq)
	case !r.FromTime.IsZero() && !r.ToTime.IsZero() && r.FromTime.After(r.ToTime):
		return fmt.Errorf("%w: from time %s is after to time %s", ErrBadRange, r.FromTime.Format(time.RFC3339), r.ToTime.Format(time.RFC3339))
	case r.FromSeq > 1 && !r.FromTime.IsZero():
		return fmt.Errorf("%w: start either by sequence or by time, not both", ErrBadRange)
	}
	return nil
}

func (r Range) partial() bool {
	return r.FromSeq > 1 || r.ToSeq > 0 || !r.FromTime.IsZero() || !r.ToTime.IsZero()
}

// Report is what verify found. Duplicate deliveries are expected and not
// counted here; duplicate effects are violations.
type Report struct {
	StreamMessages int `json:"stream_messages"`
	DistinctIDs    int `json:"distinct_ids"`
	AppliedOnce    int `json:"applied_once"`
	// Duplicated: IDs with more than one ledger entry.
	Duplicated int `json:"duplicated"`
	// Lost: stream messages neither applied (or duplicate of applied) nor
	// dead-lettered.
	Lost int `json:"lost"`
	// Unexpected: effects or inbox rows with no message in the stream.
	Unexpected int `json:"unexpected"`
	// EffectWithoutRow and RowWithoutEffect break effect ⇔ inbox row.
	EffectWithoutRow int `json:"effect_without_row"`
	RowWithoutEffect int `json:"row_without_effect"`
	// Rejected inbox rows, conflicts recorded, dead letters by status.
	// A dead letter counts only when its headers name this stream and
	// scope and a stream sequence whose message carries the dead letter's
	// message ID (Jetinbox-Message-Id).
	Rejected     int            `json:"rejected"`
	Conflicts    int            `json:"conflicts"`
	DeadLettered int            `json:"dead_lettered"`
	DeadByStatus map[string]int `json:"dead_by_status"`
	// DeadMismatched: dead letters of this stream and scope whose message
	// ID is not the ID of the stream message at their sequence. They
	// settle nothing.
	DeadMismatched int `json:"dead_mismatched,omitempty"`
	// BalanceMismatches: accounts whose balance differs from the sum of
	// the applied intents.
	BalanceMismatches int `json:"balance_mismatches"`
	// Pending: messages the durable has not settled yet (not a violation).
	Pending uint64 `json:"pending"`
	// RejectedByReason counts rejected inbox rows by reason.
	RejectedByReason map[string]int `json:"rejected_by_reason,omitempty"`
	// Horizons names settings that would let a duplicate through or lose
	// track of a message: warnings, not violations of the invariants.
	Horizons []string `json:"horizons,omitempty"`
	// Warnings name the likely cause of what follows (a scope with no
	// inbox rows at all, dead letters that match nothing). Printed first.
	Warnings []string `json:"warnings,omitempty"`
	// Partial is true when only a range of the stream was checked.
	Partial bool `json:"partial,omitempty"`
	// Examples of violations, for people.
	Examples []string `json:"examples,omitempty"`
}

// Clean reports whether no invariant is broken.
func (r *Report) Clean() bool {
	return r.Duplicated == 0 && r.Lost == 0 && r.Unexpected == 0 && r.EffectWithoutRow == 0 &&
		r.RowWithoutEffect == 0 && r.BalanceMismatches == 0
}

func (r *Report) example(format string, args ...any) {
	if len(r.Examples) < 10 {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}

// Run checks the pipeline's state.
func Run(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, o Options) (*Report, error) {
	if o.Stream == "" {
		o.Stream = jsinbox.DefaultStream
	}
	if o.Scope == "" {
		o.Scope = "ledger"
	}
	if err := o.Range.Validate(); err != nil {
		return nil, err
	}
	msgs, err := ReadRange(ctx, js, o.Stream, o.Range, o.Progress)
	if err != nil {
		return nil, err
	}
	partial := o.Range.partial()
	dead, err := ReadStream(ctx, js, jsinbox.DeadLetterStream(o.Stream))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	r := &Report{StreamMessages: len(msgs), DeadByStatus: map[string]int{}, RejectedByReason: map[string]int{}, Partial: partial}
	dl := newDeadLetters(ctx, js, o.Stream, msgs)
	for _, d := range dead {
		if d.Header[jsinbox.HeaderStream] != o.Stream || d.Header[jsinbox.HeaderScope] != o.Scope {
			continue
		}
		dl.add(r, d)
	}

	// The IDs in the stream, and every payload seen per ID by fingerprint:
	// when an ID was reused with another payload, whichever copy the
	// consumers reached first is the applied one.
	byFP := map[string]map[[32]byte][]byte{}
	for _, m := range msgs {
		if m.ID == "" {
			continue
		}
		fps := byFP[m.ID]
		if fps == nil {
			fps = map[[32]byte][]byte{}
			byFP[m.ID] = fps
		}
		fps[inbox.Fingerprint(m.Payload)] = m.Payload
	}
	r.DistinctIDs = len(byFP)

	type row struct {
		status inbox.RowStatus
		fp     []byte
		seq    uint64 // the stream message that made the row
	}
	rows := map[string]row{}
	dbRows, err := pool.Query(ctx, `SELECT message_id, status, fingerprint, coalesce(reason, ''), stream_seq FROM inbox WHERE scope = $1`, o.Scope)
	if err != nil {
		return nil, fmt.Errorf("verify: inbox: %w", err)
	}
	for dbRows.Next() {
		var id, status, reason string
		var rw row
		var seq int64
		if err := dbRows.Scan(&id, &status, &rw.fp, &reason, &seq); err != nil {
			return nil, fmt.Errorf("verify: inbox: %w", err)
		}
		rw.status, rw.seq = inbox.RowStatus(status), uint64(max(seq, 0))
		if _, in := byFP[id]; partial && !in {
			continue // outside the range: not judged
		}
		rows[id] = rw
		if rw.status == inbox.RowRejected {
			r.Rejected++
			if len(reason) > 80 {
				reason = reason[:80] + "…"
			}
			r.RejectedByReason[reason]++
		}
		if len(rw.fp) != 32 {
			r.Unexpected++
			r.example("unexpected: inbox row %q has a %d-byte fingerprint", id, len(rw.fp))
		} else if _, ok := byFP[id][[32]byte(rw.fp)]; !ok {
			r.Unexpected++
			r.example("unexpected: inbox row %q has no message with its payload in the stream", id)
		}
	}
	if err := dbRows.Err(); err != nil {
		return nil, fmt.Errorf("verify: inbox: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox_conflicts WHERE scope = $1`, o.Scope).Scan(&r.Conflicts); err != nil {
		return nil, fmt.Errorf("verify: conflicts: %w", err)
	}
	// A scope without a single inbox row while the stream has messages is
	// almost always the wrong -scope, not a stream of lost messages: say
	// so first, and name the scopes that do have rows.
	noRows := false
	if len(msgs) > 0 {
		if err := pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM inbox WHERE scope = $1)`, o.Scope).Scan(&noRows); err != nil {
			return nil, fmt.Errorf("verify: inbox: %w", err)
		}
	}
	if noRows {
		scopes, err := Scopes(ctx, pool, 20)
		if err != nil {
			return nil, err
		}
		r.Warnings = append(r.Warnings, NoRowsWarning(o.Scope, len(msgs), scopes))
	}

	entries := map[string]int{}
	if o.Ledger {
		lr, err := pool.Query(ctx, `SELECT message_id, count(*) FROM ledger_entries WHERE scope = $1 GROUP BY message_id`, o.Scope)
		if err != nil {
			return nil, fmt.Errorf("verify: ledger: %w", err)
		}
		for lr.Next() {
			var id string
			var n int
			if err := lr.Scan(&id, &n); err != nil {
				return nil, fmt.Errorf("verify: ledger: %w", err)
			}
			if _, in := byFP[id]; partial && !in {
				continue
			}
			entries[id] = n
		}
		if err := lr.Err(); err != nil {
			return nil, fmt.Errorf("verify: ledger: %w", err)
		}
		for id, n := range entries {
			if n > 1 {
				r.Duplicated++
				r.example("duplicated: %q has %d ledger entries", id, n)
			}
			if _, ok := byFP[id]; !ok {
				r.Unexpected++
				r.example("unexpected: ledger entry for %q, which is not in the stream", id)
			}
			if rw, ok := rows[id]; !ok || rw.status != inbox.RowApplied {
				r.EffectWithoutRow++
				r.example("effect without applied inbox row: %q", id)
			}
		}
		for id, rw := range rows {
			if rw.status == inbox.RowApplied && entries[id] == 0 {
				r.RowWithoutEffect++
				r.example("applied inbox row without effect: %q", id)
			}
		}
	}

	for id, rw := range rows {
		if rw.status == inbox.RowApplied && (!o.Ledger || entries[id] == 1) {
			r.AppliedOnce++
		}
	}
	for _, m := range msgs {
		if dl.at(m.Seq, m.ID) {
			continue // dead-lettered itself
		}
		rw, ok := rows[m.ID]
		if ok && rw.status == inbox.RowApplied {
			fp := inbox.Fingerprint(m.Payload)
			if bytes.Equal(rw.fp, fp[:]) {
				continue // applied, or a duplicate of the applied one
			}
		}
		// Another copy of a rejected ID (a re-publish, or its
		// redelivery): the consumer terminates it without a second dead
		// letter. The row's stream sequence names the message that was
		// dead-lettered.
		if ok && rw.status == inbox.RowRejected && dl.at(rw.seq, m.ID) {
			continue
		}
		r.Lost++
		if !noRows {
			r.example("lost: stream seq %d (id %q) neither applied nor dead-lettered", m.Seq, m.ID)
		}
	}
	if r.DeadMismatched > 0 {
		r.Warnings = append(r.Warnings, fmt.Sprintf("%d dead letters of stream %s and scope %q name a stream sequence whose message has another ID; they settle nothing", r.DeadMismatched, o.Stream, o.Scope))
	}

	if o.Ledger && !partial {
		want := map[int64]int64{}
		for id, rw := range rows {
			if rw.status != inbox.RowApplied {
				continue
			}
			if len(rw.fp) != 32 {
				continue
			}
			if in, err := effects.ParseIntent(byFP[id][[32]byte(rw.fp)]); err == nil {
				want[in.Account] += in.Amount
			}
		}
		// Other scopes apply their own effects to the same accounts: take
		// their entries as they are (their own verify judges them), so that
		// this scope's intents are still checked to the unit.
		or, err := pool.Query(ctx, `SELECT account, sum(amount)::bigint FROM ledger_entries WHERE scope <> $1 GROUP BY account`, o.Scope)
		if err != nil {
			return nil, fmt.Errorf("verify: ledger of other scopes: %w", err)
		}
		for or.Next() {
			var acct, sum int64
			if err := or.Scan(&acct, &sum); err != nil {
				return nil, fmt.Errorf("verify: ledger of other scopes: %w", err)
			}
			want[acct] += sum
		}
		if err := or.Err(); err != nil {
			return nil, fmt.Errorf("verify: ledger of other scopes: %w", err)
		}
		br, err := pool.Query(ctx, `SELECT id, balance FROM accounts`)
		if err != nil {
			return nil, fmt.Errorf("verify: accounts: %w", err)
		}
		for br.Next() {
			var id, bal int64
			if err := br.Scan(&id, &bal); err != nil {
				return nil, fmt.Errorf("verify: accounts: %w", err)
			}
			if bal != want[id] {
				r.BalanceMismatches++
				r.example("account %d: balance %d, applied intents sum to %d", id, bal, want[id])
			}
		}
		if err := br.Err(); err != nil {
			return nil, fmt.Errorf("verify: accounts: %w", err)
		}
	}

	var consumerCfg *jetstream.ConsumerConfig
	if o.Durable != "" {
		if c, err := js.Consumer(ctx, o.Stream, o.Durable); err == nil {
			if info, err := c.Info(ctx); err == nil {
				r.Pending = info.NumPending + uint64(info.NumAckPending)
				consumerCfg = &info.Config
			}
		}
	}
	if o.Horizon.Redrive && o.Horizon.DeadLetters == nil {
		if s, err := js.Stream(ctx, jsinbox.DeadLetterStream(o.Stream)); err == nil {
			cfg := s.CachedInfo().Config
			o.Horizon.DeadLetters = &cfg
		}
	}
	if s, err := js.Stream(ctx, o.Stream); err == nil {
		r.Horizons = jsinbox.CheckHorizons(s.CachedInfo().Config, consumerCfg, o.Horizon)
	}
	sort.Strings(r.Examples)
	return r, nil
}

// Message is one stream message as verify reads it.
type Message struct {
	Seq     uint64
	ID      string
	Payload []byte
	Header  map[string]string
}

// ReadStream reads every message currently in stream with an ordered
// consumer, which creates no durable state and disturbs no other consumer.
func ReadStream(ctx context.Context, js jetstream.JetStream, stream string) ([]Message, error) {
	return ReadRange(ctx, js, stream, Range{}, nil)
}

// ReadRange reads the messages of a range of stream, like ReadStream.
func ReadRange(ctx context.Context, js jetstream.JetStream, stream string, rg Range, progress func(read, total uint64)) ([]Message, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("verify: stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("verify: stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	if rg.ToSeq > 0 && rg.ToSeq < last {
		last = rg.ToSeq
	}
	out := make([]Message, 0, min(info.State.Msgs, 1<<20))
	if info.State.Msgs == 0 || last < max(rg.FromSeq, info.State.FirstSeq) {
		return out, nil
	}
	occ := jetstream.OrderedConsumerConfig{}
	switch {
	case rg.FromSeq > 1:
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, rg.FromSeq
	case !rg.FromTime.IsZero():
		occ.DeliverPolicy, occ.OptStartTime = jetstream.DeliverByStartTimePolicy, &rg.FromTime
	}
	oc, err := s.OrderedConsumer(ctx, occ)
	if err != nil {
		return nil, fmt.Errorf("verify: ordered consumer on %s: %w", stream, err)
	}
	for {
		batch, err := oc.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("verify: read %s: %w", stream, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("verify: read %s: %w", stream, err)
			}
			h := map[string]string{}
			for k, v := range m.Headers() {
				if len(v) > 0 {
					h[k] = v[0]
				}
			}
			if !rg.ToTime.IsZero() && md.Timestamp.After(rg.ToTime) {
				return out, nil
			}
			out = append(out, Message{Seq: md.Sequence.Stream, ID: h[jetstream.MsgIDHeader], Payload: m.Data(), Header: h})
			if progress != nil && len(out)%1000 == 0 {
				progress(md.Sequence.Stream, last)
			}
			if md.Sequence.Stream >= last {
				if progress != nil {
					progress(last, last)
				}
				return out, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("verify: read %s: %w", stream, err)
		}
		if n == 0 {
			return nil, fmt.Errorf("verify: read %s: stopped at %d of %d messages", stream, len(out), info.State.Msgs)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// WriteTable prints the report for people.
func (r *Report) WriteTable(w io.Writer) {
	for _, warn := range r.Warnings {
		fmt.Fprintln(w, "WARNING:", warn)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, v any, note string) { fmt.Fprintf(tw, "%s\t%v\t  %s\n", name, v, note) }
	row("stream messages", r.StreamMessages, "")
	row("distinct IDs", r.DistinctIDs, "")
	row("applied once", r.AppliedOnce, "")
	row("duplicated", r.Duplicated, Mark(r.Duplicated == 0))
	row("lost", r.Lost, Mark(r.Lost == 0))
	row("unexpected", r.Unexpected, Mark(r.Unexpected == 0))
	row("effect without row", r.EffectWithoutRow, Mark(r.EffectWithoutRow == 0))
	row("row without effect", r.RowWithoutEffect, Mark(r.RowWithoutEffect == 0))
	row("balance mismatches", r.BalanceMismatches, Mark(r.BalanceMismatches == 0))
	row("rejected (inbox)", r.Rejected, "")
	row("conflicts", r.Conflicts, "")
	row("dead-lettered", r.DeadLettered, "")
	if r.DeadMismatched > 0 {
		row("dead letters matching nothing", r.DeadMismatched, "")
	}
	row("still pending", r.Pending, "")
	tw.Flush()
	if r.Partial {
		fmt.Fprintln(w, "   (a range of the stream: rows and effects of other IDs, and balances, were not judged)")
	}
	for status, n := range r.DeadByStatus {
		fmt.Fprintf(w, "   dead letters %-10s %d\n", status+":", n)
	}
	for reason, n := range r.RejectedByReason {
		fmt.Fprintf(w, "   rejected %5d  %s\n", n, reason)
	}
	for _, h := range r.Horizons {
		fmt.Fprintln(w, "   horizon:", h)
	}
	for _, e := range r.Examples {
		fmt.Fprintln(w, "  ", e)
	}
}

// Mark is "ok" or "VIOLATION", for report tables.
func Mark(ok bool) string {
	if ok {
		return "ok"
	}
	return "VIOLATION"
}

// deadKey is what a dead letter must match: the stream sequence and the
// message ID of the stream message it stands for.
type deadKey struct {
	seq uint64
	id  string
}

// deadLetters holds the dead letters of one stream and scope, keyed by the
// stream sequence and message ID their headers name.
type deadLetters struct {
	ctx    context.Context
	js     jetstream.JetStream
	stream string
	// idAt maps the sequences read from the stream to their message IDs.
	idAt map[uint64]string
	// ok: dead letters whose ID is that of the stream message at their
	// sequence. unchecked: dead letters for sequences not read (outside
	// the range), checked against the stream when first asked about.
	ok, unchecked map[deadKey]bool
}

func newDeadLetters(ctx context.Context, js jetstream.JetStream, stream string, msgs []Message) *deadLetters {
	d := &deadLetters{ctx: ctx, js: js, stream: stream, idAt: make(map[uint64]string, len(msgs)),
		ok: map[deadKey]bool{}, unchecked: map[deadKey]bool{}}
	for _, m := range msgs {
		d.idAt[m.Seq] = m.ID
	}
	return d
}

// add files one dead letter of the stream and scope, counting it in r if it
// stands for a stream message that was read.
func (d *deadLetters) add(r *Report, m Message) {
	seq, err := strconv.ParseUint(m.Header[jsinbox.HeaderStreamSeq], 10, 64)
	id, hasID := m.Header[jsinbox.HeaderMessageID]
	if err != nil || !hasID {
		r.DeadMismatched++
		r.example("dead letter %d of %s names no stream sequence or message ID: it settles nothing", m.Seq, d.stream)
		return
	}
	k := deadKey{seq, id}
	if d.ok[k] || d.unchecked[k] {
		return // the same message dead-lettered again
	}
	sid, read := d.idAt[seq]
	switch {
	case !read:
		d.unchecked[k] = true
	case sid != id:
		r.DeadMismatched++
		r.example("dead letter %d names stream seq %d with id %q, but that message's id is %q: it settles nothing", m.Seq, seq, id, sid)
	default:
		d.ok[k] = true
		r.DeadLettered++
		r.DeadByStatus[m.Header[jsinbox.HeaderStatus]]++
	}
}

// at reports whether the stream message at seq with this ID was
// dead-lettered. A dead letter for a sequence that was not read is checked
// against the stream message now; one whose message is gone from the stream
// (aged out) is taken on its headers.
func (d *deadLetters) at(seq uint64, id string) bool {
	k := deadKey{seq, id}
	if d.ok[k] {
		return true
	}
	if !d.unchecked[k] {
		return false
	}
	delete(d.unchecked, k)
	s, err := d.js.Stream(d.ctx, d.stream)
	if err != nil {
		return false
	}
	raw, err := s.GetMsg(d.ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		d.ok[k] = true
	case err == nil && raw.Header.Get(jetstream.MsgIDHeader) == id:
		d.ok[k] = true
	}
	return d.ok[k]
}

// Scopes returns up to limit scopes that have inbox rows, in order, with an
// index skip scan over the primary key: cheap on a large inbox.
func Scopes(ctx context.Context, pool *pgxpool.Pool, limit int) ([]string, error) {
	rows, err := pool.Query(ctx, `WITH RECURSIVE s(scope) AS (
	(SELECT scope FROM inbox ORDER BY scope LIMIT 1)
	UNION ALL
	SELECT (SELECT i.scope FROM inbox i WHERE i.scope > s.scope ORDER BY i.scope LIMIT 1) FROM s WHERE s.scope IS NOT NULL
)
SELECT scope FROM s WHERE scope IS NOT NULL LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("verify: inbox scopes: %w", err)
	}
	scopes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("verify: inbox scopes: %w", err)
	}
	return scopes, nil
}

// NoRowsWarning says that scope has no inbox rows at all while the stream
// has n messages to judge, and names the scopes that do have rows.
func NoRowsWarning(scope string, n int, scopes []string) string {
	if len(scopes) == 0 {
		return fmt.Sprintf("the inbox has no rows at all, yet the stream has %d messages here: nothing consumed them into this database (is DATABASE_URL the consumer's?)", n)
	}
	q := make([]string, len(scopes))
	for i, s := range scopes {
		q[i] = strconv.Quote(s)
	}
	return fmt.Sprintf("scope %q has no inbox rows at all, yet the stream has %d messages here: -scope (JETINBOX_SCOPE) is likely wrong; scopes with rows: %s",
		scope, n, strings.Join(q, ", "))
}
