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
	"sort"

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
