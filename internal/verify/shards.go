package verify

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

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
	// ExpiredBeforeRescue: expired records (the rescue of a partition
	// durable found the message it was to rescue aged out of the stream)
	// whose stream sequence no shard's inbox row names: the intent's fate
	// is unknown, a violation.
	ExpiredBeforeRescue int `json:"expired_before_rescue"`
	// ExpiredApplied: expired records whose stream sequence made an
	// applied inbox row in a shard (applied, its ack lost, given up on,
	// aged out): settled, not a violation. Their IDs are judged with the
	// stream's (their entries are not unexpected).
	ExpiredApplied int `json:"expired_applied,omitempty"`
	// AwaitingRescue: IDs with no entry in any shard and no dead letter
	// whose message the server gave up on and whose max-deliveries
	// advisory the rescue durable of its partition has not settled yet.
	// Not lost: the shard owning the partition will apply or dead-letter
	// it. AwaitingRescueSince is when the server gave up on the oldest.
	AwaitingRescue      int       `json:"awaiting_rescue"`
	AwaitingRescueSince time.Time `json:"awaiting_rescue_since,omitzero"`
	// BalanceMismatches: accounts whose balance summed over the shards
	// differs from their entries summed over the shards.
	BalanceMismatches int `json:"balance_mismatches"`
	// AppliedIn counts the applied IDs per shard.
	AppliedIn map[string]int `json:"applied_in"`
	// Examples name a few violations.
	Examples []string `json:"examples,omitempty"`
	// Warnings say what is not a violation but needs a look.
	Warnings []string `json:"warnings,omitempty"`
}

// Clean reports whether nothing was lost, duplicated, unexpected, off
// balance or expired before its rescue.
func (r *ShardsReport) Clean() bool {
	return r.Lost == 0 && r.Duplicated == 0 && r.Unexpected == 0 && r.BalanceMismatches == 0 && r.ExpiredBeforeRescue == 0
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
//
// durables are the partition durables (see the shard map): the messages
// the server gave up on whose advisory their rescue durable has not
// settled are counted awaiting rescue, not lost, as [Run] counts them.
// Expired records in the dead-letter stream are judged as Run judges
// them: a violation, unless a shard's inbox row names the sequence as
// applied.
func Shards(ctx context.Context, js jetstream.JetStream, stream, scope string, shards []ShardDB, durables ...string) (*ShardsReport, error) {
	// The rescues under way first, as Run reads them: a rescue that ends
	// meanwhile has dead-lettered or applied its message by the time the
	// dead letters and the shards are read.
	aw, err := readAwaitingOf(ctx, js, stream, durables)
	if err != nil {
		return nil, err
	}
	msgs, err := ReadStream(ctx, js, stream)
	if err != nil {
		return nil, err
	}
	dead, err := ReadStream(ctx, js, jsinbox.DeadLetterStream(stream))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	r := &ShardsReport{StreamMessages: len(msgs), AppliedIn: map[string]int{}}
	held := make(map[uint64]bool, len(msgs))
	for _, m := range msgs {
		held[m.Seq] = true
	}
	deadIDs := map[string]bool{}
	// expired: the sequences of genuine expired records, with their
	// delivery counts.
	expired := map[uint64]string{}
	judge := &deadLetters{stream: stream}
	for _, d := range dead {
		if d.Header[jsinbox.HeaderScope] != scope || d.Header[jsinbox.HeaderStream] != stream {
			continue
		}
		if d.Header[jsinbox.HeaderStatus] != jsinbox.DeadLetterExpired {
			deadIDs[d.Header[jsinbox.HeaderMessageID]] = true
			continue
		}
		if why := judge.foreign(d); why != "" {
			r.example("foreign: message %d of %s %s: it settles nothing", d.Seq, jsinbox.DeadLetterStream(stream), why)
			continue
		}
		seq, _ := strconv.ParseUint(d.Header[jsinbox.HeaderStreamSeq], 10, 64)
		if held[seq] {
			r.example("foreign: message %d of %s says stream seq %d expired, but the stream holds it", d.Seq, jsinbox.DeadLetterStream(stream), seq)
			continue
		}
		expired[seq] = d.Header[jsinbox.HeaderDelivered]
	}
	ids := map[string]bool{}
	// awaitingSince: the IDs with a message awaiting its rescue, and when
	// the server gave up on the first.
	awaitingSince := map[string]time.Time{}
	for _, m := range msgs {
		ids[m.ID] = true
		if since, ok := aw.seqs[m.Seq]; ok {
			if t, seen := awaitingSince[m.ID]; !seen || since.Before(t) {
				awaitingSince[m.ID] = since
			}
		}
	}
	if err := shardsExpired(ctx, r, stream, scope, shards, expired, ids); err != nil {
		return nil, err
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
		case total == 0 && !awaitingSince[id].IsZero():
			r.AwaitingRescue++
			if since := awaitingSince[id]; r.AwaitingRescueSince.IsZero() || since.Before(r.AwaitingRescueSince) {
				r.AwaitingRescueSince = since
			}
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
	r.Warnings = awaitingWarnings(aw, r.AwaitingRescue, r.AwaitingRescueSince, stream)
	sort.Strings(r.Examples)
	return r, nil
}

// shardsExpired judges the expired records: a sequence that made an
// applied inbox row in some shard was applied before it aged out (its ack
// lost), and its ID joins ids to be judged with the stream's; any other is
// a violation, expired before its rescue.
func shardsExpired(ctx context.Context, r *ShardsReport, stream, scope string, shards []ShardDB, expired map[uint64]string, ids map[string]bool) error {
	if len(expired) == 0 {
		return nil
	}
	seqs := slices.Sorted(maps.Keys(expired))
	args := make([]int64, len(seqs))
	for i, s := range seqs {
		args[i] = int64(s)
	}
	applied := map[uint64]string{}
	for _, s := range shards {
		rows, err := s.DB.Query(ctx, `SELECT message_id, stream_seq FROM inbox WHERE scope = $1 AND status = 'applied' AND stream_seq = ANY($2)`, scope, args)
		if err != nil {
			return fmt.Errorf("verify: shard %s: inbox rows of expired messages: %w", s.Name, err)
		}
		var id string
		var seq int64
		if _, err := pgx.ForEachRow(rows, []any{&id, &seq}, func() error { applied[uint64(seq)] = id; return nil }); err != nil {
			return fmt.Errorf("verify: shard %s: inbox rows of expired messages: %w", s.Name, err)
		}
	}
	for _, seq := range seqs {
		id, ok := applied[seq]
		if !ok {
			r.ExpiredBeforeRescue++
			r.example("expired before rescue: stream seq %d was given up on after %s deliveries and aged out of %s before a shard rescued it; no shard's inbox row names it, so whether it was applied is unknown",
				seq, expired[seq], stream)
			continue
		}
		r.ExpiredApplied++
		ids[id] = true
	}
	return nil
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
	row("expired before rescue", r.ExpiredBeforeRescue, Mark(r.ExpiredBeforeRescue == 0))
	if r.ExpiredApplied > 0 {
		row("expired, found applied", r.ExpiredApplied, "(settled)")
	}
	if r.AwaitingRescue > 0 {
		row("awaiting rescue", r.AwaitingRescue, "(given up on, rescue pending: not lost)")
	}
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
	for _, e := range r.Warnings {
		fmt.Fprintln(w, "  warning: "+e)
	}
}
