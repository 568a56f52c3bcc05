// The baseline of a sharded run: the same messages through one plain
// consumer on one durable; and the setting before one batcher per shard.

package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/shard"
)

const (
	// modeOneDurable: one `jetinbox consumer` on one durable of the
	// whole stream, one PostgreSQL, no shard map.
	modeOneDurable = "one durable"
	// modePartitionBatches: the shards' consumers with
	// -partition-batches, each partition forming its own batches.
	modePartitionBatches = "per-partition batches"
	// modeShardDurables: the shards' map has shard_durables, one durable
	// per shard filtered on its partitions.
	modeShardDurables = "one durable per shard"
)

// label names the row in progress lines and tables.
func (row ShardsRow) label() string {
	switch row.Mode {
	case modeOneDurable:
		return "1 durable"
	case modePartitionBatches:
		return fmt.Sprintf("%d, per-partition batches", row.Shards)
	case modeShardDurables:
		return fmt.Sprintf("%d, a durable per shard", row.Shards)
	}
	if row.Shards == 1 {
		return "1 shard"
	}
	return fmt.Sprintf("%d shards", row.Shards)
}

// oneDurableRow consumes the whole stream with one plain consumer on a
// durable of its own, on the first PostgreSQL, in a database without a
// partition table: the single-durable path, measured as the shard rows
// are.
func (b *shardsBench) oneDurableRow(ctx context.Context, exe string, round int) (ShardsRound, error) {
	name := fmt.Sprintf("bench_r%d_one", round)
	s := &shardDB{s: shard.Shard{Name: "one", Partitions: allPartitions(b.o.Partitions)}, db: name}
	if _, err := b.pgs[0].CreateDatabase(ctx, name); err != nil {
		return ShardsRound{}, err
	}
	st, err := pgDatabases{b.pgs[0]}.openExisting(ctx, name, b.o.Accounts)
	if err != nil {
		return ShardsRound{}, err
	}
	s.store = st
	defer func() {
		if s.store != nil {
			s.store.Close()
		}
	}()
	for _, in := range b.intents {
		s.msgs++
		s.sum += amountOf(in)
	}
	if err := b.pgs[0].Settle(ctx, 30*time.Second); err != nil {
		return ShardsRound{}, err
	}
	wal0, err := walLSN(ctx, st.PG)
	if err != nil {
		return ShardsRound{}, err
	}
	pg0, cpu0, start := treeCPU(b.pids[0]), cpuTime(), time.Now()
	url := b.pgs[0].URL(name)
	stream := b.base.Stream
	cons, err := b.startConsumers(ctx, exe, []*shardDB{s}, func(*shardDB) []string {
		return []string{"consumer", "-database-url", url, "-stream", stream, "-durable", name}
	})
	if err != nil {
		return ShardsRound{}, err
	}
	defer cons.stop()
	done, err := b.waitApplied(ctx, []*shardDB{s}, start, cons)
	if err != nil {
		return ShardsRound{}, err
	}
	r := ShardsRound{Elapsed: time.Since(start)}
	procCPU := cons.cpu()
	r.ProcCPU = cpuTime() - cpu0
	f := ShardFigures{Name: s.s.Name, Partitions: s.s.Partitions, Msgs: s.msgs, Elapsed: done[0].Sub(start),
		PGCPU: treeCPU(b.pids[0]) - pg0, ConsumerCPU: procCPU[0]}
	if wal1, err := walLSN(ctx, st.PG); err == nil {
		_ = st.PG.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)`, wal1, wal0).Scan(&f.WALBytes)
	}
	if err := cons.stop(); err != nil {
		return ShardsRound{}, err
	}
	if err := checkLedger(ctx, st, s.msgs, s.sum); err != nil {
		return ShardsRound{}, fmt.Errorf("one durable: %w", err)
	}
	if err := st.PG.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM ledger_entries`).Scan(&f.Transactions); err != nil {
		return ShardsRound{}, err
	}
	r.Shards = []ShardFigures{f}
	s.store.Close()
	s.store = nil
	if err := b.pgs[0].DropDatabase(ctx, name); err != nil {
		return ShardsRound{}, err
	}
	for _, st := range []string{stream, jsinbox.AdvisoryStream(stream)} {
		if err := b.js.DeleteConsumer(ctx, st, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return ShardsRound{}, err
		}
	}
	return r, nil
}

func allPartitions(n int) shard.Set {
	s := make(shard.Set, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// firstShardRow is the index of the first row of shards with one batcher
// each: the model's input.
func (r *ShardsResult) firstShardRow() int {
	if i := r.firstRowOf(""); i >= 0 {
		return i
	}
	return 0
}

// firstRowOf is the index of the first row of mode, or -1.
func (r *ShardsResult) firstRowOf(mode string) int {
	for i, row := range r.Rows {
		if row.Mode == mode {
			return i
		}
	}
	return -1
}

// baseline is the one-durable row, if the run has one.
func (r *ShardsResult) baseline() *ShardsRow {
	for i := range r.Rows {
		if r.Rows[i].Mode == modeOneDurable {
			return &r.Rows[i]
		}
	}
	return nil
}

// costRatios pairs row's PostgreSQL and NATS (deliver and ack) CPU per
// message with the one-durable row's, round by round.
func (r *ShardsResult) costRatios(row ShardsRow) (pg, nats ratio, ok bool) {
	base := r.baseline()
	if base == nil {
		return ratio{}, ratio{}, false
	}
	var a, b, x, y []float64
	for i := range min(len(row.Rounds), len(base.Rounds)) {
		c, bc := row.Rounds[i].costs(r.PublishCPU), base.Rounds[i].costs(r.PublishCPU)
		a, b = append(a, float64(c.PG)), append(b, float64(bc.PG))
		x, y = append(x, float64(c.Process)), append(y, float64(bc.Process))
	}
	return ratios(a, b), ratios(x, y), true
}
