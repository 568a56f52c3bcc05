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
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/effects"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/jitter"
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
	Horizon HorizonOptions
	// Progress, if set, is called as the stream is read.
	Progress func(read, total uint64)
}

// Range is a part of the stream, by sequence or time. Zero fields are open.
type Range struct {
	FromSeq, ToSeq   uint64
	FromTime, ToTime time.Time
}

func (r Range) partial() bool {
	return r.FromSeq > 1 || r.ToSeq > 0 || !r.FromTime.IsZero() || !r.ToTime.IsZero()
}

// HorizonOptions are the settings verify cannot read from the servers.
type HorizonOptions struct {
	// Retention is how long inbox rows are kept (the Prune OlderThan in
	// use). Zero: never pruned.
	Retention time.Duration
	// NakCap is the consumer's longest nak delay. Default 30s.
	NakCap time.Duration
	// PublishRetry is the producer's retry horizon. Default: that of
	// jitter.Default().
	PublishRetry time.Duration
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
	Rejected     int            `json:"rejected"`
	Conflicts    int            `json:"conflicts"`
	DeadLettered int            `json:"dead_lettered"`
	DeadByStatus map[string]int `json:"dead_by_status"`
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
	msgs, err := ReadRange(ctx, js, o.Stream, o.Range, o.Progress)
	if err != nil {
		return nil, err
	}
	partial := o.Range.partial()
	dead, err := ReadStream(ctx, js, o.Stream+"_DLQ")
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	r := &Report{StreamMessages: len(msgs), DeadByStatus: map[string]int{}, RejectedByReason: map[string]int{}, Partial: partial}
	deadSeqs := map[uint64]bool{}
	for _, d := range dead {
		if d.Header[jsinbox.HeaderStream] != o.Stream || d.Header[jsinbox.HeaderScope] != o.Scope {
			continue
		}
		seq, _ := strconv.ParseUint(d.Header[jsinbox.HeaderStreamSeq], 10, 64)
		if !deadSeqs[seq] {
			deadSeqs[seq] = true
			r.DeadLettered++
			r.DeadByStatus[d.Header[jsinbox.HeaderStatus]]++
		}
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
		status string
		fp     []byte
	}
	rows := map[string]row{}
	dbRows, err := pool.Query(ctx, `SELECT message_id, status, fingerprint, coalesce(reason, '') FROM inbox WHERE scope = $1`, o.Scope)
	if err != nil {
		return nil, fmt.Errorf("verify: inbox: %w", err)
	}
	for dbRows.Next() {
		var id, reason string
		var rw row
		if err := dbRows.Scan(&id, &rw.status, &rw.fp, &reason); err != nil {
			return nil, fmt.Errorf("verify: inbox: %w", err)
		}
		if _, in := byFP[id]; partial && !in {
			continue // outside the range: not judged
		}
		rows[id] = rw
		if rw.status == "rejected" {
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
			if rw, ok := rows[id]; !ok || rw.status != "applied" {
				r.EffectWithoutRow++
				r.example("effect without applied inbox row: %q", id)
			}
		}
		for id, rw := range rows {
			if rw.status == "applied" && entries[id] == 0 {
				r.RowWithoutEffect++
				r.example("applied inbox row without effect: %q", id)
			}
		}
	}

	for id, rw := range rows {
		if rw.status == "applied" && (!o.Ledger || entries[id] == 1) {
			r.AppliedOnce++
		}
	}
	for _, m := range msgs {
		if deadSeqs[m.Seq] {
			continue
		}
		rw, ok := rows[m.ID]
		if ok && rw.status == "applied" {
			fp := inbox.Fingerprint(m.Payload)
			if bytes.Equal(rw.fp, fp[:]) {
				continue // applied, or a duplicate of the applied one
			}
		}
		r.Lost++
		r.example("lost: stream seq %d (id %q) neither applied nor dead-lettered", m.Seq, m.ID)
	}

	if o.Ledger && !partial {
		want := map[int64]int64{}
		for id, rw := range rows {
			if rw.status != "applied" {
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
	if s, err := js.Stream(ctx, o.Stream); err == nil {
		r.Horizons = CheckHorizons(s.CachedInfo().Config, consumerCfg, o.Horizon)
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

// CheckHorizons names the settings under which a message could come back
// after the inbox forgot it (a duplicate effect), or be given up on.
func CheckHorizons(stream jetstream.StreamConfig, consumer *jetstream.ConsumerConfig, h HorizonOptions) []string {
	if h.NakCap == 0 {
		h.NakCap = 30 * time.Second
	}
	if h.PublishRetry == 0 {
		h.PublishRetry, _ = jitter.Default().Horizon()
	}
	var p []string
	if h.Retention > 0 {
		if stream.MaxAge == 0 {
			p = append(p, fmt.Sprintf("stream %s keeps messages forever (MaxAge 0) but inbox rows are pruned after %v: a replay or re-drive of an older message applies it again; set MaxAge below the inbox retention", stream.Name, h.Retention))
		} else if stream.MaxAge > h.Retention {
			p = append(p, fmt.Sprintf("stream MaxAge %v is longer than the inbox retention %v: a message can be replayed after its inbox row is gone; raise the retention (Prune OlderThan) above MaxAge", stream.MaxAge, h.Retention))
		}
	}
	if consumer != nil {
		if consumer.MaxDeliver < 1 {
			p = append(p, fmt.Sprintf("durable %s has unlimited MaxDeliver: a message that keeps failing is never dead-lettered", consumer.Durable))
		} else if h.Retention > 0 {
			step := max(consumer.AckWait, h.NakCap)
			if n := len(consumer.BackOff); n > 0 {
				step = max(step, consumer.BackOff[n-1])
			}
			if redelivery := time.Duration(consumer.MaxDeliver) * step; redelivery > h.Retention {
				p = append(p, fmt.Sprintf("MaxDeliver %d × %v can redeliver a message %v after its first delivery, longer than the inbox retention %v", consumer.MaxDeliver, step, redelivery, h.Retention))
			}
		}
	}
	if stream.Duplicates < h.PublishRetry {
		p = append(p, fmt.Sprintf("duplicate window %v is shorter than the producer's retry horizon %v: late retries become second stream messages (the inbox still drops them)", stream.Duplicates, h.PublishRetry))
	}
	return p
}
