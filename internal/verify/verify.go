// Package verify checks a pipeline's final state against its stream: it reads
// every message with direct gets (creating no consumer, so it disturbs none),
// reads the dead-letter stream, the inbox and the ledger, and reports lost,
// duplicated and unexpected effects.
package verify

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/jscheck"
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
	Horizon jscheck.HorizonOptions
	// Progress, if set, is called as the stream is read.
	Progress func(read, total uint64)

	// chunk is how many stream messages are judged at a time (0:
	// defaultChunk). The report does not depend on it.
	chunk int
}

// defaultChunk is how many stream messages Run judges at a time.
const defaultChunk = 10000

// Run checks the pipeline's state. It walks the range in chunks of stream
// messages and reads the inbox rows and ledger entries of each chunk's IDs
// only, so its memory follows the chunk size, the accounts and the
// dead-letter stream, not the stream: what it keeps across chunks is
// counts, balances per account, and the few IDs whose inbox row does not
// name a message of the chunk that holds them (copies published again
// after the duplicate window, messages without a row).
func Run(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, o Options) (*Report, error) {
	return RunOn(ctx, js, Postgres(pool), o)
}

// RunOn is [Run] on any store's database: PostgreSQL or SQLite.
func RunOn(ctx context.Context, js jetstream.JetStream, db DB, o Options) (*Report, error) {
	if o.Stream == "" {
		o.Stream = jsinbox.DefaultStream
	}
	if o.Scope == "" {
		o.Scope = "ledger"
	}
	if o.chunk <= 0 {
		o.chunk = defaultChunk
	}
	if err := o.Range.Validate(); err != nil {
		return nil, err
	}
	partial := o.Range.partial()
	// The rescues under way, read before the dead letters and the stream:
	// a rescue that ends meanwhile has dead-lettered its message after
	// the dead-letter stream was read, or applied it by the time the
	// chunk with it reads the inbox, and its message counts as awaiting,
	// not lost.
	aw, err := readAwaiting(ctx, js, o.Stream, o.Durable)
	if err != nil {
		return nil, err
	}
	dead, err := ReadStream(ctx, js, jsinbox.DeadLetterStream(o.Stream))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	r := &Report{DeadByStatus: map[string]int{}, RejectedByReason: map[string]int{}, Partial: partial}
	c := &checker{ctx: ctx, js: js, db: db, o: o, r: r, partial: partial,
		dl: newDeadLetters(ctx, js, o.Stream, o.Scope, o.Range), carried: map[string]bool{}, deferred: map[string]map[[32]byte][]byte{},
		unmatched: map[string]row{}, want: map[int64]int64{}, idAt: map[uint64]string{}, awaiting: aw}
	for _, d := range dead {
		c.dl.add(r, d)
	}
	dead = nil
	if err := c.expiredApplied(); err != nil {
		return nil, err
	}
	if err := db.queryRow(ctx, stmt{`SELECT count(*) FROM inbox_conflicts WHERE scope = $1`, `SELECT count(*) FROM inbox_conflicts WHERE scope = ?1`}, o.Scope).Scan(&r.Conflicts); err != nil {
		return nil, fmt.Errorf("verify: conflicts: %w", err)
	}
	// A scope without a single inbox row while the stream has messages is
	// almost always the wrong -scope, not a stream of lost messages: say
	// so first, and name the scopes that do have rows.
	if err := db.queryRow(ctx, stmt{`SELECT NOT EXISTS (SELECT 1 FROM inbox WHERE scope = $1)`, `SELECT NOT EXISTS (SELECT 1 FROM inbox WHERE scope = ?1)`}, o.Scope).Scan(&c.noRows); err != nil {
		return nil, fmt.Errorf("verify: inbox: %w", err)
	}
	if c.last, err = walkRange(ctx, js, o.Stream, o.Range, o.chunk, o.Progress, c.chunk); err != nil {
		return nil, err
	}
	if err := c.finish(); err != nil {
		return nil, err
	}
	if c.noRows && r.StreamMessages > 0 {
		scopes, err := ScopesOn(ctx, db, 20)
		if err != nil {
			return nil, err
		}
		r.Warnings = append(r.Warnings, NoRowsWarning(o.Scope, r.StreamMessages, scopes))
	}
	r.awaitingWarning(c.awaiting, o.Stream)
	if r.DeadMismatched > 0 {
		r.Warnings = append(r.Warnings, fmt.Sprintf("%d dead letters of stream %s and scope %q name a stream sequence whose message has another ID; they settle nothing", r.DeadMismatched, o.Stream, o.Scope))
	}
	if r.DeadForeign > 0 {
		r.Warnings = append(r.Warnings, fmt.Sprintf("%d messages in %s were not written by a consumer of %s (a reply subject routed a server answer there, or a key that may publish there did): they settle nothing; find who can reach the dead-letter subjects",
			r.DeadForeign, jsinbox.DeadLetterStream(o.Stream), o.Stream))
	}
	if o.Ledger && !partial {
		if err := c.balances(); err != nil {
			return nil, err
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
		r.Horizons = jscheck.CheckHorizons(s.CachedInfo().Config, consumerCfg, o.Horizon)
	}
	sort.Strings(r.Examples)
	return r, nil
}
