// The chain: the follow-ups a scope's applied messages emitted through the
// outbox, checked against the next stream and the scope that applies them.

package verify

import (
	"context"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/effects"
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
	// ChunkSize is how many IDs are read and looked up at a time. Default
	// 10000.
	ChunkSize int
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

// defaultChainChunk is how many IDs the chain check reads and looks up at
// a time.
const defaultChainChunk = 10000

// Chain checks one hop of follow-ups: every applied message of the parent
// scope has its follow-up in the next stream exactly once by ID (copies of
// one ID are counted apart), applied once by the next scope; nothing is in
// the next stream without an applied parent. It runs on either store (db:
// [Postgres] or [SQLite]).
//
// Memory: one 64-bit hash per distinct follow-up ID in the stream, kept in
// sorted runs (8 bytes an ID, up to twice that while two runs merge: 80 to
// 160 MB for ten million), plus one chunk of messages and IDs at a time;
// nothing per parent. The stream is read once, in chunks: each chunk's new
// IDs are looked up in the database (the parent applied? the next scope
// applied it, how often?). Then the applied parents
// are read in chunks of their primary key, and each parent's follow-up ID is
// looked up in the hash set, the ones missing there in the outbox (still
// pending, or lost). Only follow-up IDs in the hashed long form whose
// parent is not applied under the literal reading are kept whole, until the
// parents with IDs that long have been read. A hash collision (odds about
// IDs² / 2^65, randomly seeded per run) could hide one lost follow-up or
// one copy; it can never report a violation that is not there.
func Chain(ctx context.Context, js jetstream.JetStream, db DB, o ChainOptions) (*ChainReport, error) {
	if o.ParentScope == "" {
		o.ParentScope = effects.DefaultScope
	}
	if o.Kind == "" {
		o.Kind = effects.DefaultFollowUpKind
	}
	if o.Stream == "" {
		return nil, fmt.Errorf("verify: chain: no stream to check")
	}
	if o.ChunkSize <= 0 {
		o.ChunkSize = defaultChainChunk
	}
	if _, err := outbox.FollowUpID("x", o.Kind); err != nil {
		return nil, fmt.Errorf("verify: chain: %w", err)
	}
	c := chain{ctx: ctx, db: db, o: o, r: &ChainReport{}, seed: maphash.MakeSeed(), hashed: map[string]struct{}{}}
	_, err := walkRange(ctx, js, o.Stream, Range{}, o.ChunkSize, nil, func(chunk []Message) error {
		return c.streamChunk(chunk)
	})
	if err != nil {
		return nil, fmt.Errorf("verify: chain: stream %s: %w", o.Stream, err)
	}
	if err := c.parents(); err != nil {
		return nil, err
	}
	for id := range c.hashed {
		c.r.Unexpected++
		c.r.example("unexpected: %s is in %s, but no applied message of scope %q emits it", id, o.Stream, o.ParentScope)
	}
	return c.r, nil
}

// chain is the state of one chain check.
type chain struct {
	ctx  context.Context
	db   DB
	o    ChainOptions
	r    *ChainReport
	seed maphash.Seed
	// seen holds the hash of every distinct follow-up ID read from the
	// stream.
	seen hashRuns
	// hashed holds follow-up IDs of the hashed long form (kind:h<sha256>)
	// whose parent is not known yet.
	hashed map[string]struct{}
}

func (c *chain) hash(id string) uint64 { return maphash.String(c.seed, id) }

// isHashedForm reports whether id could be a follow-up ID in the hashed
// long form: prefix + "h" + 64 hex digits.
func isHashedForm(id, prefix string) bool {
	rest, ok := strings.CutPrefix(id, prefix+"h")
	if !ok || len(rest) != 64 {
		return false
	}
	_, err := hex.DecodeString(rest)
	return err == nil
}

// streamChunk counts one chunk of the stream: copies, follow-ups without
// an applied parent, and how the next scope applied the new ones.
func (c *chain) streamChunk(chunk []Message) error {
	prefix := c.o.Kind + ":"
	var fresh, parents []string
	inChunk := make(map[uint64]struct{}, len(chunk))
	for _, m := range chunk {
		h := c.hash(m.ID)
		if _, ok := inChunk[h]; ok || c.seen.has(h) {
			c.r.Copies++
			continue
		}
		inChunk[h] = struct{}{}
		c.r.InStream++
		parent, ok := strings.CutPrefix(m.ID, prefix)
		if !ok || inbox.ValidateID(parent) != nil {
			c.r.Unexpected++
			c.r.example("unexpected: %q is in %s, but it is no follow-up of kind %q", m.ID, c.o.Stream, c.o.Kind)
			continue
		}
		fresh = append(fresh, m.ID)
		parents = append(parents, parent)
	}
	c.seen.add(slices.Collect(maps.Keys(inChunk)))
	if len(fresh) == 0 {
		return nil
	}
	applied, err := c.lookup(stmt{
		`SELECT message_id, 1 FROM inbox WHERE scope = $1 AND status = 'applied' AND message_id = ANY($2)`,
		`SELECT message_id, 1 FROM inbox WHERE scope = ?1 AND status = 'applied' AND message_id IN (SELECT value FROM json_each(?2))`,
	}, c.o.ParentScope, parents)
	if err != nil {
		return fmt.Errorf("verify: chain: parents: %w", err)
	}
	for i, id := range fresh {
		if applied[parents[i]] > 0 {
			continue
		}
		if isHashedForm(id, prefix) {
			c.hashed[id] = struct{}{} // judged once the long parents are read
			continue
		}
		c.r.Unexpected++
		c.r.example("unexpected: %s is in %s, but no applied message of scope %q emits it", id, c.o.Stream, c.o.ParentScope)
	}
	if c.o.Scope == "" {
		return nil
	}
	next, err := c.lookup(stmt{
		`SELECT message_id, 1 FROM inbox WHERE scope = $1 AND status = 'applied' AND message_id = ANY($2)`,
		`SELECT message_id, 1 FROM inbox WHERE scope = ?1 AND status = 'applied' AND message_id IN (SELECT value FROM json_each(?2))`,
	}, c.o.Scope, fresh)
	if err != nil {
		return fmt.Errorf("verify: chain: next scope: %w", err)
	}
	var entries map[string]int
	if c.o.Ledger {
		if entries, err = c.lookup(stmt{
			`SELECT message_id, count(*)::int FROM ledger_entries WHERE scope = $1 AND message_id = ANY($2) GROUP BY message_id`,
			`SELECT message_id, count(*) FROM ledger_entries WHERE scope = ?1 AND message_id IN (SELECT value FROM json_each(?2)) GROUP BY message_id`,
		}, c.o.Scope, fresh); err != nil {
			return fmt.Errorf("verify: chain: next scope's ledger: %w", err)
		}
	}
	for _, id := range fresh {
		n := next[id]
		if c.o.Ledger && n > 0 {
			n = entries[id]
		}
		switch {
		case n == 0:
			c.r.NotApplied++
			c.r.example("not applied: %s is in %s, but scope %q has not applied it", id, c.o.Stream, c.o.Scope)
		case n > 1:
			c.r.Duplicated++
			c.r.example("duplicated: %s applied %d times by scope %q", id, n, c.o.Scope)
		default:
			c.r.AppliedOnce++
		}
	}
	return nil
}

// parents reads the applied parents in chunks of their primary key and
// counts the follow-ups that are missing from the stream: pending in the
// outbox, or lost.
func (c *chain) parents() error {
	after := ""
	for {
		page, err := c.page(after)
		if err != nil {
			return err
		}
		if len(page) == 0 {
			return nil
		}
		after = page[len(page)-1]
		c.r.Parents += len(page)
		var missing, of []string
		for _, parent := range page {
			id, err := outbox.FollowUpID(parent, c.o.Kind)
			if err != nil {
				return fmt.Errorf("verify: chain: %w", err)
			}
			delete(c.hashed, id)
			if !c.seen.has(c.hash(id)) {
				missing, of = append(missing, id), append(of, parent)
			}
		}
		if len(missing) == 0 {
			continue
		}
		pending, err := c.lookup(stmt{
			`SELECT id, 1 FROM outbox WHERE sent_at IS NULL AND failed IS NULL AND id = ANY($1)`,
			`SELECT id, 1 FROM outbox WHERE sent_at IS NULL AND failed IS NULL AND id IN (SELECT value FROM json_each(?1))`,
		}, missing)
		if err != nil {
			return fmt.Errorf("verify: chain: outbox: %w", err)
		}
		for i, id := range missing {
			if pending[id] > 0 {
				c.r.Pending++
				continue
			}
			c.r.Lost++
			c.r.example("lost: %s, the follow-up of applied %s, is neither in %s nor pending in the outbox", id, of[i], c.o.Stream)
		}
	}
}

// page returns the next chunk of applied parents after the given ID, in
// primary-key order.
func (c *chain) page(after string) ([]string, error) {
	rows, err := c.db.query(c.ctx, stmt{
		`SELECT message_id FROM inbox WHERE scope = $1 AND status = 'applied' AND message_id > $2 ORDER BY message_id LIMIT $3`,
		`SELECT message_id FROM inbox WHERE scope = ?1 AND status = 'applied' AND message_id > ?2 ORDER BY message_id LIMIT ?3`,
	}, c.o.ParentScope, after, c.o.ChunkSize)
	if err != nil {
		return nil, fmt.Errorf("verify: chain: parents: %w", err)
	}
	defer rows.Close()
	var page []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("verify: chain: parents: %w", err)
		}
		page = append(page, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("verify: chain: parents: %w", err)
	}
	return page, nil
}

// hashRuns is a set of 64-bit hashes in sorted runs, each at most half as
// long as the one before it: 8 bytes a hash, a lookup a binary search per
// run (about log2 of the count), and a merge, when a run grows to half the
// one before it, costs the two runs' length once.
type hashRuns struct{ runs [][]uint64 }

// has reports whether h is in the set.
func (s *hashRuns) has(h uint64) bool {
	for _, r := range s.runs {
		if _, ok := slices.BinarySearch(r, h); ok {
			return true
		}
	}
	return false
}

// add adds hs, none of them in the set yet; it keeps hs.
func (s *hashRuns) add(hs []uint64) {
	if len(hs) == 0 {
		return
	}
	slices.Sort(hs)
	s.runs = append(s.runs, hs)
	for n := len(s.runs); n > 1 && len(s.runs[n-2]) <= 2*len(s.runs[n-1]); n = len(s.runs) {
		a, b := s.runs[n-2], s.runs[n-1]
		merged := make([]uint64, 0, len(a)+len(b))
		for len(a) > 0 && len(b) > 0 {
			if a[0] < b[0] {
				merged, a = append(merged, a[0]), a[1:]
			} else {
				merged, b = append(merged, b[0]), b[1:]
			}
		}
		merged = append(append(merged, a...), b...)
		s.runs[n-2] = merged
		s.runs = s.runs[:n-1]
	}
}

// lookup runs a query whose rows are an ID and a count.
func (c *chain) lookup(q stmt, args ...any) (map[string]int, error) {
	rows, err := c.db.query(c.ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		got[id] = n
	}
	return got, rows.Err()
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
