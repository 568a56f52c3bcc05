package verify

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
)

// ShardDB is one shard's database, by the shard's name.
type ShardDB struct {
	Name string
	DB   *pgxpool.Pool
}

// ShardsReport is the check of a sharded stream against every shard's
// ledger at once, counted per message ID over all shards.
type ShardsReport struct {
	StreamMessages int `json:"stream_messages"`
	DistinctIDs    int `json:"distinct_ids"`
	// AppliedOnce: one ledger entry over all shards.
	AppliedOnce int `json:"applied_once"`
	// Lost: no entry in any shard and no dead letter for the scope.
	Lost int `json:"lost"`
	// Duplicated: more than one entry over all shards; InTwoShards: of
	// those, entries in more than one shard (the failure sharding adds).
	Duplicated  int `json:"duplicated"`
	InTwoShards int `json:"in_two_shards"`
	// Unexpected: entries of IDs the stream never held.
	Unexpected   int `json:"unexpected"`
	DeadLettered int `json:"dead_lettered"`
	// BalanceMismatches: accounts whose balance summed over the shards
	// differs from their entries summed over the shards.
	BalanceMismatches int `json:"balance_mismatches"`
	// AppliedIn counts the applied IDs per shard.
	AppliedIn map[string]int `json:"applied_in"`
	// Examples name a few violations.
	Examples []string `json:"examples,omitempty"`
}

// Clean reports whether nothing was lost, duplicated, unexpected or off
// balance.
func (r *ShardsReport) Clean() bool {
	return r.Lost == 0 && r.Duplicated == 0 && r.Unexpected == 0 && r.BalanceMismatches == 0
}

func (r *ShardsReport) example(format string, args ...any) {
	if len(r.Examples) < 10 {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}

// Shards checks a sharded stream against the ledgers of all its shards
// (PostgreSQL) for one scope: every ID in the stream is applied once in
// exactly one shard or dead-lettered, none is applied in two, no shard has
// an entry the stream never held, and the partial balances summed over the
// shards match the entries. It reads the stream with direct gets and keeps
// its IDs in memory.
func Shards(ctx context.Context, js jetstream.JetStream, stream, scope string, shards []ShardDB) (*ShardsReport, error) {
	msgs, err := ReadStream(ctx, js, stream)
	if err != nil {
		return nil, err
	}
	dead, err := ReadStream(ctx, js, jsinbox.DeadLetterStream(stream))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	r := &ShardsReport{StreamMessages: len(msgs), AppliedIn: map[string]int{}}
	deadIDs := map[string]bool{}
	for _, d := range dead {
		if d.Header[jsinbox.HeaderScope] == scope && d.Header[jsinbox.HeaderStream] == stream {
			deadIDs[d.Header[jsinbox.HeaderMessageID]] = true
		}
	}
	ids := map[string]bool{}
	for _, m := range msgs {
		ids[m.ID] = true
	}
	r.DistinctIDs = len(ids)
	// entries[id][shard] = entries of id in that shard.
	entries := map[string]map[int]int{}
	entrySum := map[int64]int64{}
	dbs := make([]effects.Querier, len(shards))
	for i, s := range shards {
		dbs[i] = s.DB
		rows, err := s.DB.Query(ctx, `SELECT message_id, count(*) FROM ledger_entries WHERE scope = $1 GROUP BY message_id`, scope)
		if err != nil {
			return nil, fmt.Errorf("verify: shard %s: %w", s.Name, err)
		}
		var id string
		var n int
		if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error {
			if entries[id] == nil {
				entries[id] = map[int]int{}
			}
			entries[id][i] += n
			return nil
		}); err != nil {
			return nil, fmt.Errorf("verify: shard %s: %w", s.Name, err)
		}
		// Balances hold every scope's credits: sum all entries.
		rows, err = s.DB.Query(ctx, `SELECT account, sum(amount)::bigint FROM ledger_entries GROUP BY account`)
		if err != nil {
			return nil, fmt.Errorf("verify: shard %s: %w", s.Name, err)
		}
		var acct, amt int64
		if _, err := pgx.ForEachRow(rows, []any{&acct, &amt}, func() error { entrySum[acct] += amt; return nil }); err != nil {
			return nil, fmt.Errorf("verify: shard %s: %w", s.Name, err)
		}
	}
	for id := range ids {
		per := entries[id]
		total := 0
		for _, n := range per {
			total += n
		}
		switch {
		case total == 1:
			r.AppliedOnce++
			for i := range per {
				r.AppliedIn[shards[i].Name]++
			}
		case total == 0 && deadIDs[id]:
			r.DeadLettered++
		case total == 0:
			r.Lost++
			r.example("lost: %s has no entry in any shard and no dead letter", id)
		default:
			r.Duplicated++
			if len(per) > 1 {
				r.InTwoShards++
				var names []string
				for i := range per {
					names = append(names, shards[i].Name)
				}
				sort.Strings(names)
				r.example("duplicated: %s has %d entries, in shards %v", id, total, names)
			} else {
				r.example("duplicated: %s has %d entries in one shard", id, total)
			}
		}
	}
	for id := range entries {
		if !ids[id] {
			r.Unexpected++
			r.example("unexpected: %s has entries but is not in %s", id, stream)
		}
	}
	bal, err := effects.Balances(ctx, dbs...)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	for acct, b := range bal {
		if b != entrySum[acct] {
			r.BalanceMismatches++
			r.example("balance: account %d is %d summed over the shards, its entries sum to %d", acct, b, entrySum[acct])
		}
	}
	return r, nil
}

// WriteTable prints the report.
func (r *ShardsReport) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, n int, mark string) { fmt.Fprintf(tw, "%s\t%d\t %s\n", name, n, mark) }
	row("stream messages", r.StreamMessages, "")
	row("distinct IDs", r.DistinctIDs, "")
	row("applied once", r.AppliedOnce, "over all shards")
	row("duplicated", r.Duplicated, Mark(r.Duplicated == 0))
	row("in two shards", r.InTwoShards, Mark(r.InTwoShards == 0))
	row("lost", r.Lost, Mark(r.Lost == 0))
	row("unexpected", r.Unexpected, Mark(r.Unexpected == 0))
	row("dead-lettered", r.DeadLettered, "")
	row("balance mismatches", r.BalanceMismatches, Mark(r.BalanceMismatches == 0))
	names := make([]string, 0, len(r.AppliedIn))
	for n := range r.AppliedIn {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		row("applied in "+n, r.AppliedIn[n], "")
	}
	tw.Flush()
	for _, e := range r.Examples {
		fmt.Fprintln(w, "  "+e)
	}
}
