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
)

// Options says what to check.
type Options struct {
	// Stream is the intents stream. Default "INTENTS".
	Stream string
	// Scope is the inbox scope (the durable's name). Default "ledger".
	Scope string
	// Durable, if set, is consulted for messages still pending.
	Durable string
	// Ledger checks the ledger effect: entries per message and balances.
	// Default true via NewOptions; set false for other effects.
	Ledger bool
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
	msgs, err := ReadStream(ctx, js, o.Stream)
	if err != nil {
		return nil, err
	}
	dead, err := ReadStream(ctx, js, o.Stream+"_DLQ")
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	r := &Report{StreamMessages: len(msgs), DeadByStatus: map[string]int{}}
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
	dbRows, err := pool.Query(ctx, `SELECT message_id, status, fingerprint FROM inbox WHERE scope = $1`, o.Scope)
	if err != nil {
		return nil, fmt.Errorf("verify: inbox: %w", err)
	}
	for dbRows.Next() {
		var id string
		var rw row
		if err := dbRows.Scan(&id, &rw.status, &rw.fp); err != nil {
			return nil, fmt.Errorf("verify: inbox: %w", err)
		}
		rows[id] = rw
		if rw.status == "rejected" {
			r.Rejected++
		}
		if _, ok := byFP[id][[32]byte(rw.fp)]; !ok && len(rw.fp) == 32 {
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
		lr, err := pool.Query(ctx, `SELECT message_id, count(*) FROM ledger_entries GROUP BY message_id`)
		if err != nil {
			return nil, fmt.Errorf("verify: ledger: %w", err)
		}
		for lr.Next() {
			var id string
			var n int
			if err := lr.Scan(&id, &n); err != nil {
				return nil, fmt.Errorf("verify: ledger: %w", err)
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

	if o.Ledger {
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

	if o.Durable != "" {
		if c, err := js.Consumer(ctx, o.Stream, o.Durable); err == nil {
			if info, err := c.Info(ctx); err == nil {
				r.Pending = info.NumPending + uint64(info.NumAckPending)
			}
		}
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
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("verify: stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("verify: stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	out := make([]Message, 0, info.State.Msgs)
	if info.State.Msgs == 0 {
		return out, nil
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
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
			out = append(out, Message{Seq: md.Sequence.Stream, ID: h[jetstream.MsgIDHeader], Payload: m.Data(), Header: h})
			if md.Sequence.Stream >= last {
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
	row("duplicated", r.Duplicated, mark(r.Duplicated == 0))
	row("lost", r.Lost, mark(r.Lost == 0))
	row("unexpected", r.Unexpected, mark(r.Unexpected == 0))
	row("effect without row", r.EffectWithoutRow, mark(r.EffectWithoutRow == 0))
	row("row without effect", r.RowWithoutEffect, mark(r.RowWithoutEffect == 0))
	row("balance mismatches", r.BalanceMismatches, mark(r.BalanceMismatches == 0))
	row("rejected (inbox)", r.Rejected, "")
	row("conflicts", r.Conflicts, "")
	row("dead-lettered", r.DeadLettered, "")
	row("still pending", r.Pending, "")
	tw.Flush()
	for _, e := range r.Examples {
		fmt.Fprintln(w, "  ", e)
	}
}

func mark(ok bool) string {
	if ok {
		return "ok"
	}
	return "VIOLATION"
}
