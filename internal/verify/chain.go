// The chain: the follow-ups a scope's applied messages emitted through the
// outbox, checked against the next stream and the scope that applies them.

package verify

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/effects"
	"github.com/jetinbox/jetinbox/outbox"
)

// ChainOptions says which hop to check.
type ChainOptions struct {
	// ParentScope is the scope whose applied messages each emit one
	// follow-up of Kind. Default "ledger".
	ParentScope string
	// Kind of the follow-ups (outbox.FollowUpID). Default "notify".
	Kind string
	// Stream is the stream the follow-ups are published to. Required.
	Stream string
	// Scope, if set, is the scope that applies the follow-ups: each must
	// have an applied inbox row there (and, with Ledger, one ledger entry).
	Scope  string
	Ledger bool
}

// ChainReport is what the chain check found.
type ChainReport struct {
	// Parents: applied messages of the parent scope.
	Parents int `json:"parents"`
	// InStream: distinct follow-up IDs in the stream; Copies: messages
	// beyond the first of an ID (a relay that published again after the
	// duplicate window; the next inbox drops them).
	InStream int `json:"in_stream"`
	Copies   int `json:"copies"`
	// Pending: follow-ups of applied parents still in the outbox, not yet
	// published (not a violation while the relay runs).
	Pending int `json:"pending"`
	// Lost: applied parents whose follow-up is neither in the stream nor
	// pending in the outbox (a row the stream refused for good counts
	// here).
	Lost int `json:"lost"`
	// Unexpected: follow-ups in the stream without an applied parent.
	Unexpected int `json:"unexpected"`
	// NotApplied: follow-ups in the stream the next scope has not applied
	// (rejected ones included); Duplicated: applied more than once.
	NotApplied int `json:"not_applied"`
	Duplicated int `json:"duplicated"`
	// AppliedOnce: follow-ups the next scope applied exactly once.
	AppliedOnce int      `json:"applied_once"`
	Examples    []string `json:"examples,omitempty"`
}

// Clean reports whether the chain holds: nothing lost, nothing without a
// parent, nothing applied twice, and (with a Scope) everything applied.
func (r *ChainReport) Clean() bool {
	return r.Lost == 0 && r.Unexpected == 0 && r.Duplicated == 0 && r.NotApplied == 0
}

func (r *ChainReport) example(format string, args ...any) {
	if len(r.Examples) < 10 {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}

// Chain checks one hop of follow-ups: every applied message of the parent
// scope has its follow-up in the next stream exactly once by ID (copies of
// one ID are counted apart), applied once by the next scope; nothing is in
// the next stream without an applied parent. It holds every ID of the hop
// in memory.
func Chain(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, o ChainOptions) (*ChainReport, error) {
	if o.ParentScope == "" {
		o.ParentScope = effects.DefaultScope
	}
	if o.Kind == "" {
		o.Kind = effects.DefaultFollowUpKind
	}
	if o.Stream == "" {
		return nil, fmt.Errorf("verify: chain: no stream to check")
	}
	r := &ChainReport{}
	// What each applied parent must have emitted.
	want := map[string]string{} // follow-up ID → parent
	rows, err := pool.Query(ctx, `SELECT message_id FROM inbox WHERE scope = $1 AND status = 'applied'`, o.ParentScope)
	if err != nil {
		return nil, fmt.Errorf("verify: chain: parents: %w", err)
	}
	for rows.Next() {
		var parent string
		if err := rows.Scan(&parent); err != nil {
			rows.Close()
			return nil, fmt.Errorf("verify: chain: parents: %w", err)
		}
		id, err := outbox.FollowUpID(parent, o.Kind)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("verify: chain: %w", err)
		}
		want[id] = parent
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("verify: chain: parents: %w", err)
	}
	r.Parents = len(want)
	seen := map[string]int{}
	_, err = walkRange(ctx, js, o.Stream, Range{}, 10000, nil, func(chunk []Message) error {
		for _, m := range chunk {
			seen[m.ID]++
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("verify: chain: stream %s: %w", o.Stream, err)
	}
	pending := map[string]bool{}
	prow, err := pool.Query(ctx, `SELECT id FROM outbox WHERE sent_at IS NULL AND failed IS NULL`)
	if err != nil {
		return nil, fmt.Errorf("verify: chain: outbox: %w", err)
	}
	for prow.Next() {
		var id string
		if err := prow.Scan(&id); err != nil {
			prow.Close()
			return nil, fmt.Errorf("verify: chain: outbox: %w", err)
		}
		pending[id] = true
	}
	if err := prow.Err(); err != nil {
		return nil, fmt.Errorf("verify: chain: outbox: %w", err)
	}
	ids := make([]string, 0, len(seen))
	for id, n := range seen {
		r.InStream++
		r.Copies += n - 1
		ids = append(ids, id)
		if _, ok := want[id]; !ok {
			r.Unexpected++
			r.example("unexpected: %s is in %s, but no applied message of scope %q emits it", id, o.Stream, o.ParentScope)
		}
	}
	for id, parent := range want {
		switch {
		case seen[id] > 0:
		case pending[id]:
			r.Pending++
		default:
			r.Lost++
			r.example("lost: %s, the follow-up of applied %s, is neither in %s nor pending in the outbox", id, parent, o.Stream)
		}
	}
	if o.Scope == "" {
		return r, nil
	}
	applied := map[string]bool{}
	entries := map[string]int{}
	for start := 0; start < len(ids); start += 10000 {
		part := ids[start:min(len(ids), start+10000)]
		if err := scan(ctx, pool, `SELECT message_id FROM inbox WHERE scope = $1 AND status = 'applied' AND message_id = ANY($2)`, func(id string, _ int) {
			applied[id] = true
		}, o.Scope, part); err != nil {
			return nil, err
		}
		if o.Ledger {
			if err := scan(ctx, pool, `SELECT message_id, count(*)::int FROM ledger_entries WHERE scope = $1 AND message_id = ANY($2) GROUP BY message_id`, func(id string, n int) {
				entries[id] = n
			}, o.Scope, part); err != nil {
				return nil, err
			}
		}
	}
	for _, id := range ids {
		n := 1
		if o.Ledger {
			n = entries[id]
		}
		switch {
		case !applied[id] || n == 0:
			r.NotApplied++
			r.example("not applied: %s is in %s, but scope %q has not applied it", id, o.Stream, o.Scope)
		case n > 1:
			r.Duplicated++
			r.example("duplicated: %s applied %d times by scope %q", id, n, o.Scope)
		default:
			r.AppliedOnce++
		}
	}
	return r, nil
}

// scan runs a query whose rows are an ID and, optionally, a count.
func scan(ctx context.Context, pool *pgxpool.Pool, sql string, each func(id string, n int), args ...any) error {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("verify: chain: %w", err)
	}
	defer rows.Close()
	cols := len(rows.FieldDescriptions())
	for rows.Next() {
		var id string
		var n int
		dst := []any{&id, &n}[:cols]
		if err := rows.Scan(dst...); err != nil {
			return fmt.Errorf("verify: chain: %w", err)
		}
		each(id, n)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("verify: chain: %w", err)
	}
	return nil
}

// WriteTable prints the chain report for people.
func (r *ChainReport) WriteTable(w io.Writer, o ChainOptions) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, v any, note string) { fmt.Fprintf(tw, "%s\t%v\t  %s\n", name, v, note) }
	row("applied parents", r.Parents, "")
	row("follow-ups in "+o.Stream, r.InStream, "")
	row("copies of one ID", r.Copies, "(dropped by the next inbox)")
	row("pending in the outbox", r.Pending, "")
	row("lost", r.Lost, Mark(r.Lost == 0))
	row("without applied parent", r.Unexpected, Mark(r.Unexpected == 0))
	if o.Scope != "" {
		row("applied once by "+o.Scope, r.AppliedOnce, "")
		row("not applied", r.NotApplied, Mark(r.NotApplied == 0))
		row("duplicated", r.Duplicated, Mark(r.Duplicated == 0))
	}
	tw.Flush()
	for _, e := range r.Examples {
		fmt.Fprintln(w, "  ", e)
	}
}
