// `jetinbox bench -shards 1,2,4`: one stream partitioned by its subject
// transform, consumed by 1, 2, 4 shards, each on a PostgreSQL of its own
// through the production consumer (`jetinbox consumer -shards FILE -shard
// NAME`), with what each message cost each part; then a model of the
// aggregate on hosts of their own, from those costs.

package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/procstat"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// ShardsOptions of a sharded bench run.
type ShardsOptions struct {
	// Counts are the shard counts measured, one row each, e.g. 1, 2, 4.
	Counts []int
	// N messages, published once; every row consumes all of them.
	N          int
	Accounts   int
	Partitions int
	// Batch and InFlight are the consumer's -batch and -inflight.
	Batch, InFlight int
	// Rounds: every row runs once per round; figures are medians, ratios
	// paired round by round.
	Rounds     int
	SyncAlways bool
	// Processes runs each shard's consumer as a `jetinbox consumer`
	// process (this binary must be jetinbox), so that its CPU is told
	// apart from the nats-server's; otherwise the same command runs in
	// this process.
	Processes bool
	// HostCores and NATSCores are the cores of a shard's host and of the
	// NATS host in the model.
	HostCores, NATSCores int
	// ModelHosts are the host counts of the model's table.
	ModelHosts []int
	Progress   io.Writer
	// OneDurable adds a first row: the same messages through one plain
	// consumer on one durable of the whole stream, one PostgreSQL, the
	// baseline of the CPU ratios. PartitionBatches runs every shard count
	// a second time with each partition consumer forming its own batches
	// (the setting before one batcher per shard), beside it.
	OneDurable, PartitionBatches bool
	// ShardDurables runs every shard count a second time with one durable
	// per shard (the map's shard_durables) beside a durable per partition.
	ShardDurables bool

	// partitionOf, if set, replaces the server's partition function in
	// the bench's expectations (a test shows the check goes red).
	partitionOf func(id string, n int) int
}

func (o *ShardsOptions) defaults() {
	if o.Partitions == 0 {
		o.Partitions = shard.DefaultPartitions
	}
	if o.HostCores == 0 {
		o.HostCores = runtime.NumCPU()
	}
	if o.NATSCores == 0 {
		o.NATSCores = runtime.NumCPU()
	}
	if len(o.ModelHosts) == 0 {
		o.ModelHosts = []int{1, 2, 4, 8, 16}
	}
	if o.partitionOf == nil {
		o.partitionOf = shard.PartitionOf
	}
}

func (o ShardsOptions) validate() error {
	var errs []error
	if len(o.Counts) == 0 {
		errs = append(errs, errors.New("-shards: want shard counts such as 1,2,4"))
	}
	for _, k := range o.Counts {
		if k < 1 || k > o.Partitions {
			errs = append(errs, fmt.Errorf("-shards: %d shards: want 1 to -partitions (%d)", k, o.Partitions))
		}
	}
	for _, f := range []struct {
		name   string
		v, min int
	}{{"n", o.N, 1}, {"accounts", o.Accounts, 1}, {"batch", o.Batch, 1}, {"inflight", o.InFlight, 1}, {"rounds", o.Rounds, 1},
		{"host-cores", o.HostCores, 1}, {"nats-cores", o.NATSCores, 1}} {
		if f.v < f.min {
			errs = append(errs, fmt.Errorf("-%s %d: must be at least %d", f.name, f.v, f.min))
		}
	}
	if o.Partitions < 1 || o.Partitions > 1024 {
		errs = append(errs, fmt.Errorf("-partitions %d: want 1 to 1024", o.Partitions))
	}
	return errors.Join(errs...)
}

// parseCounts reads "1,2,4".
func parseCounts(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < 1 {
			return nil, fmt.Errorf("-%s %q: %q is not a positive count", flagName, s, f)
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out, nil
}

// ShardsMain is `jetinbox bench -shards LIST`: its own flags, after it.
func ShardsMain(ctx context.Context, list string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox bench -shards", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := ShardsOptions{Progress: stderr}
	var hosts string
	fs.IntVar(&o.N, "n", 100_000, "messages, published once; every row consumes all of them")
	fs.IntVar(&o.Accounts, "accounts", 1024, "accounts the effect spreads over")
	fs.IntVar(&o.Partitions, "partitions", shard.DefaultPartitions, "the stream's partition count")
	fs.IntVar(&o.Batch, "batch", 6000, "consumer: most messages per transaction")
	fs.IntVar(&o.InFlight, "inflight", 2, "consumer: batches in flight per partition")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds; figures are medians over rounds, ratios paired round by round")
	fs.BoolVar(&o.SyncAlways, "sync-always", false, "JetStream fsyncs every write (production setting)")
	fs.BoolVar(&o.Processes, "processes", true, "run each shard's consumer as a `jetinbox consumer -shards FILE -shard NAME` process (this binary), so its CPU is told apart from the nats-server's; false: the same command in this process")
	fs.IntVar(&o.HostCores, "host-cores", runtime.NumCPU(), "model: cores of each shard's PostgreSQL host")
	fs.IntVar(&o.NATSCores, "nats-cores", runtime.NumCPU(), "model: cores of the NATS host (the stream leader)")
	fs.StringVar(&hosts, "model-hosts", "1,2,4,8,16", "model: host counts of the table")
	fs.BoolVar(&o.OneDurable, "one-durable", true, "also run the messages through one plain consumer on one durable (the baseline of the CPU ratios)")
	fs.BoolVar(&o.ShardDurables, "beside-shard-durables", true, "also run each shard count with one durable per shard, filtered on its partitions (the map's shard_durables), beside a durable per partition")
	fs.BoolVar(&o.PartitionBatches, "beside-partition-batches", false, "also run each shard count with every partition consumer forming its own batches (consumer -partition-batches), beside one batcher per shard")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox bench -shards 1,2,4: one stream partitioned by its subject transform, consumed by\n"+
			"that many shards, each on a throwaway PostgreSQL of its own (fsync on), through jetinbox consumer -shards;\n"+
			"rates, CPU per message of PostgreSQL, consumers and nats-server, WAL per message, and a model of the\n"+
			"aggregate for N hosts from those costs.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	var err error
	if o.Counts, err = parseCounts("shards", list); err != nil {
		errs = append(errs, err)
	}
	if o.ModelHosts, err = parseCounts("model-hosts", hosts); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, o.validate())
	if err := errors.Join(errs...); err != nil {
		return cli.UsageError{Err: fmt.Errorf("bench -shards: %w", err)}
	}
	res, err := RunShards(ctx, o)
	if err != nil {
		return err
	}
	res.Write(stdout)
	return nil
}

// ShardFigures is what one shard of a row did in one round.
type ShardFigures struct {
	Name       string
	Partitions shard.Set
	Msgs       int
	// Elapsed: from the consumers' start until this shard applied its
	// last message.
	Elapsed time.Duration
	// PGCPU is the CPU of the shard's PostgreSQL server (postmaster and
	// every backend, from /proc); ConsumerCPU the consumer process's
	// (zero when it ran in this process).
	PGCPU, ConsumerCPU time.Duration
	WALBytes           float64
	// Transactions that committed ledger entries: each partition's
	// consumer commits its own batches.
	Transactions int
}

// ShardsRound is one row in one round.
type ShardsRound struct {
	Elapsed time.Duration
	Shards  []ShardFigures
	// ProcCPU is this process's CPU while the row consumed: the
	// nats-server, and the consumers when they ran in this process.
	ProcCPU time.Duration
}

// Cores is how many cores the row kept busy on average: PostgreSQL, the
// consumers and this process together. On a shared machine, what is short
// of its cores went to other work or to waiting.
func (r ShardsRound) Cores() float64 {
	cpu := r.ProcCPU
	for _, s := range r.Shards {
		cpu += s.PGCPU + s.ConsumerCPU
	}
	return cpu.Seconds() / r.Elapsed.Seconds()
}

// Rate is the aggregate rate.
func (r ShardsRound) Rate() float64 {
	n := 0
	for _, s := range r.Shards {
		n += s.Msgs
	}
	return float64(n) / r.Elapsed.Seconds()
}

// ShardsRow is one shard count over the rounds.
type ShardsRow struct {
	Shards int
	// Mode is "" (a durable per partition, one batcher per shard),
	// modeOneDurable, modeShardDurables or modePartitionBatches.
	Mode   string
	Rounds []ShardsRound
}

// ShardsResult is what a sharded bench run measured.
type ShardsResult struct {
	Opts ShardsOptions
	// PublishRate, and PublishCPU per message: this process while the
	// messages were stored (the nats-server and the publisher's client).
	PublishRate float64
	PublishCPU  time.Duration
	Rows        []ShardsRow
	// Verified: every row's ledgers checked, and verify -shards clean.
	Verified bool
}

// shardsBench is a run's shared state.
type shardsBench struct {
	o       ShardsOptions
	js      jetstream.JetStream
	natsURL string
	pgs     []*testenv.Postgres
	pids    []int // each server's postmaster
	dir     string
	base    shard.Map
	intents []inbox.Intent
	say     func(string, ...any)
}

// RunShards publishes the messages into the sharded stream and consumes
// them with each shard count, round after round.
func RunShards(ctx context.Context, o ShardsOptions) (*ShardsResult, error) {
	o.defaults()
	if err := o.validate(); err != nil {
		return nil, cli.UsageError{Err: fmt.Errorf("bench -shards: %w", err)}
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	b := &shardsBench{o: o, say: func(f string, a ...any) { fmt.Fprintf(o.Progress, "shards: "+f+"\n", a...) }}
	var exe string
	if o.Processes {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("bench -shards: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "jetinbox-shardbench-")
	if err != nil {
		return nil, fmt.Errorf("bench -shards: %w", err)
	}
	defer os.RemoveAll(dir)
	b.dir = dir
	srv, err := natsenv.StartNATS(natsenv.NATSOptions{SyncAlways: o.SyncAlways})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	b.natsURL = srv.URL()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		return nil, fmt.Errorf("bench -shards: %w", err)
	}
	defer nc.Close()
	if b.js, err = jetstream.New(nc); err != nil {
		return nil, fmt.Errorf("bench -shards: %w", err)
	}
	// One PostgreSQL per shard of the widest row; a narrower row uses the
	// first ones, and the others idle.
	for i := range slices.Max(o.Counts) {
		pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Durable: true})
		if err != nil {
			return nil, err
		}
		defer pg.Close()
		pid, err := postmasterPID(ctx, pg)
		if err != nil {
			return nil, err
		}
		b.pgs, b.pids = append(b.pgs, pg), append(b.pids, pid)
		b.say("PostgreSQL %d of %d started (postmaster %d)", i+1, slices.Max(o.Counts), pid)
	}
	b.base = (&shard.Map{Partitions: o.Partitions}).WithDefaults()
	if err := b.base.EnsureStream(ctx, b.js, jsinbox.StreamConfig{}); err != nil {
		return nil, err
	}
	res := &ShardsResult{Opts: o}
	if err := b.publish(ctx, res); err != nil {
		return nil, err
	}
	b.say("published %d messages at %.0f msg/s", o.N, res.PublishRate)
	if o.OneDurable {
		res.Rows = append(res.Rows, ShardsRow{Shards: 1, Mode: modeOneDurable})
	}
	for _, k := range o.Counts {
		res.Rows = append(res.Rows, ShardsRow{Shards: k})
		if o.ShardDurables {
			res.Rows = append(res.Rows, ShardsRow{Shards: k, Mode: modeShardDurables})
		}
		if o.PartitionBatches {
			res.Rows = append(res.Rows, ShardsRow{Shards: k, Mode: modePartitionBatches})
		}
	}
	for round := 1; round <= o.Rounds; round++ {
		for i, row := range res.Rows {
			k := row.Shards
			r, err := b.row(ctx, exe, round, k, row.Mode)
			if err != nil {
				return nil, fmt.Errorf("bench -shards: %s, round %d: %w", row.label(), round, err)
			}
			res.Rows[i].Rounds = append(res.Rows[i].Rounds, r)
			per := make([]string, len(r.Shards))
			for j, s := range r.Shards {
				per[j] = fmt.Sprintf("%.0f", float64(s.Msgs)/s.Elapsed.Seconds())
			}
			b.say("round %d, %s: %d msgs in %.2fs = %.0f msg/s (per shard %s)", round, row.label(), o.N, r.Elapsed.Seconds(), r.Rate(), strings.Join(per, ", "))
		}
	}
	res.Verified = true
	return res, nil
}

// publish stores the messages once, each on its ID's key subject.
func (b *shardsBench) publish(ctx context.Context, res *ShardsResult) error {
	b.intents = pipeline.Generate(pipeline.Load{Count: b.o.N, Accounts: b.o.Accounts, Prefix: "s", Seed: 7})
	for i := range b.intents {
		kind := strings.Replace(b.intents[i].Subject, "intents.", "ledger.", 1)
		b.intents[i].Subject = shard.PublishSubject(b.base.Subject, b.intents[i].ID, kind)
	}
	pub, err := jsinbox.NewPublisher(b.js, jsinbox.PublisherConfig{Stream: b.base.Stream, MaxInFlight: 8192})
	if err != nil {
		return err
	}
	defer pub.Close()
	cpu0, t0 := cpuTime(), time.Now()
	for _, in := range b.intents {
		if err := pub.PublishAsync(ctx, in); err != nil {
			return err
		}
	}
	if err := pub.Flush(ctx); err != nil {
		return err
	}
	el, cpu := time.Since(t0), cpuTime()-cpu0
	if s := pub.Stats(); s.Failed > 0 {
		return fmt.Errorf("bench -shards: %d publishes failed", s.Failed)
	}
	res.PublishRate = float64(b.o.N) / el.Seconds()
	res.PublishCPU = cpu / time.Duration(b.o.N)
	return nil
}

// shardDB is one shard of a row: its map entry, database and what it must
// end with.
type shardDB struct {
	s     shard.Shard
	db    string
	store *cli.Store
	msgs  int
	sum   int64
}

// row runs k shards over the whole stream once and checks their ledgers.
func (b *shardsBench) row(ctx context.Context, exe string, round, k int, mode string) (ShardsRound, error) {
	if mode == modeOneDurable {
		return b.oneDurableRow(ctx, exe, round)
	}
	m := b.base
	m.DurablePrefix = fmt.Sprintf("bench_r%d_k%d%s", round, k, map[string]string{modePartitionBatches: "pb", modeShardDurables: "sd"}[mode])
	m.ShardDurables = mode == modeShardDurables
	shards := make([]*shardDB, k)
	for i := range k {
		var set shard.Set
		for p := i * m.Partitions / k; p < (i+1)*m.Partitions/k; p++ {
			set = append(set, p)
		}
		db := fmt.Sprintf("%s_s%d", m.DurablePrefix, i)
		if _, err := b.pgs[i].CreateDatabase(ctx, db); err != nil {
			return ShardsRound{}, err
		}
		shards[i] = &shardDB{s: shard.Shard{Name: "s" + strconv.Itoa(i), DatabaseURL: b.pgs[i].URL(db), Partitions: set}, db: db}
		m.Shards = append(m.Shards, shards[i].s)
	}
	if err := m.Validate(); err != nil {
		return ShardsRound{}, err
	}
	// What each shard must apply: the messages of its partitions, by the
	// partition the stream's transform gives their key token.
	owner := make([]int, m.Partitions)
	for i, s := range shards {
		for _, p := range s.s.Partitions {
			owner[p] = i
		}
	}
	for _, in := range b.intents {
		s := shards[owner[b.o.partitionOf(in.ID, m.Partitions)]]
		s.msgs++
		s.sum += amountOf(in)
	}
	defer func() {
		for _, s := range shards {
			if s.store != nil {
				s.store.Close()
			}
		}
	}()
	for i, s := range shards {
		st, err := pgDatabases{b.pgs[i]}.openExisting(ctx, s.db, b.o.Accounts)
		if err != nil {
			return ShardsRound{}, err
		}
		s.store = st
		if _, err := shard.Migrate(ctx, st.PG, &m, s.s.Name); err != nil {
			return ShardsRound{}, err
		}
	}
	mapFile := filepath.Join(b.dir, m.DurablePrefix+".json")
	if err := m.Save(mapFile); err != nil {
		return ShardsRound{}, err
	}
	for i := range k {
		if err := b.pgs[i].Settle(ctx, 30*time.Second); err != nil {
			return ShardsRound{}, err
		}
	}

	// The clock and the counters start with the consumers.
	wal0 := make([]string, k)
	pg0 := make([]time.Duration, k)
	for i, s := range shards {
		var err error
		if wal0[i], err = walLSN(ctx, s.store.PG); err != nil {
			return ShardsRound{}, err
		}
		pg0[i] = treeCPU(b.pids[i])
	}
	cpu0 := cpuTime()
	start := time.Now()
	cons, err := b.startConsumers(ctx, exe, shards, func(s *shardDB) []string {
		args := []string{"consumer", "-shards", mapFile, "-shard", s.s.Name}
		if mode == modePartitionBatches {
			args = append(args, "-partition-batches")
		}
		return args
	})
	if err != nil {
		return ShardsRound{}, err
	}
	defer cons.stop()
	done, err := b.waitApplied(ctx, shards, start, cons)
	if err != nil {
		return ShardsRound{}, err
	}
	r := ShardsRound{Elapsed: time.Since(start)}
	procCPU := cons.cpu()
	r.ProcCPU = cpuTime() - cpu0
	for i, s := range shards {
		f := ShardFigures{Name: s.s.Name, Partitions: s.s.Partitions, Msgs: s.msgs, Elapsed: done[i].Sub(start),
			PGCPU: treeCPU(b.pids[i]) - pg0[i], ConsumerCPU: procCPU[i]}
		if wal1, err := walLSN(ctx, s.store.PG); err == nil {
			_ = s.store.PG.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)`, wal1, wal0[i]).Scan(&f.WALBytes)
		}
		r.Shards = append(r.Shards, f)
	}
	if err := cons.stop(); err != nil {
		return ShardsRound{}, err
	}

	// Checked: each shard holds exactly its partitions' messages once,
	// balances exact, and verify -shards finds every stream message
	// applied once in exactly one shard.
	dbs := make([]verify.ShardDB, k)
	for i, s := range shards {
		if err := checkLedger(ctx, s.store, s.msgs, s.sum); err != nil {
			return ShardsRound{}, fmt.Errorf("shard %s (partitions %s): %w", s.s.Name, s.s.Partitions, err)
		}
		if err := s.store.PG.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM ledger_entries`).Scan(&r.Shards[i].Transactions); err != nil {
			return ShardsRound{}, fmt.Errorf("shard %s: %w", s.s.Name, err)
		}
		dbs[i] = verify.ShardDB{Name: s.s.Name, DB: s.store.PG}
	}
	rep, err := verify.Shards(ctx, b.js, m.Stream, m.Scope, dbs, m.ConsumerDurables()...)
	if err != nil {
		return ShardsRound{}, err
	}
	if !rep.Clean() || rep.AppliedOnce != b.o.N {
		return ShardsRound{}, fmt.Errorf("verify -shards: %d applied once of %d, lost %d, duplicated %d (in two shards %d), unexpected %d: %s",
			rep.AppliedOnce, b.o.N, rep.Lost, rep.Duplicated, rep.InTwoShards, rep.Unexpected, strings.Join(rep.Examples, "; "))
	}

	// Cleaned up, so that the next row measures itself alone: the
	// databases dropped, the durables deleted.
	for i, s := range shards {
		s.store.Close()
		s.store = nil
		if err := b.pgs[i].DropDatabase(ctx, s.db); err != nil {
			return ShardsRound{}, err
		}
	}
	for _, d := range m.ConsumerDurables() {
		if err := b.js.DeleteConsumer(ctx, m.Stream, d); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return ShardsRound{}, err
		}
		if err := b.js.DeleteConsumer(ctx, jsinbox.AdvisoryStream(m.Stream), d); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return ShardsRound{}, err
		}
	}
	return r, nil
}

// openExisting opens database name (made already), migrated, with
// accounts 1..accounts.
func (d pgDatabases) openExisting(ctx context.Context, name string, accounts int) (*cli.Store, error) {
	cfg, err := pgxpool.ParseConfig(d.pg.URL(name))
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 4
	pginbox.WatchCommits(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return prepare(ctx, &cli.Store{PG: pool}, accounts)
}

// waitApplied polls each shard's balances (a sum over the accounts, cheap
// beside a count of the inbox) until each shard credited what its
// partitions hold, and returns when each did.
func (b *shardsBench) waitApplied(ctx context.Context, shards []*shardDB, start time.Time, cons *consumers) ([]time.Time, error) {
	done := make([]time.Time, len(shards))
	last := make([]int64, len(shards))
	progressed := time.Now()
	for {
		left := 0
		for i, s := range shards {
			if !done[i].IsZero() {
				continue
			}
			var bal int64
			if err := s.store.PG.QueryRow(ctx, `SELECT coalesce(sum(balance), 0)::bigint FROM accounts`).Scan(&bal); err != nil {
				return nil, fmt.Errorf("shard %s: %w", s.s.Name, err)
			}
			switch {
			case bal == s.sum:
				done[i] = time.Now()
			case bal > s.sum:
				return nil, fmt.Errorf("shard %s credited %d, more than its partitions' messages hold (%d)", s.s.Name, bal, s.sum)
			default:
				left++
			}
			if bal != last[i] {
				last[i], progressed = bal, time.Now()
			}
		}
		if left == 0 {
			return done, nil
		}
		if err := cons.failed(); err != nil {
			return nil, err
		}
		if time.Since(progressed) > 2*time.Minute {
			var short []string
			for i, s := range shards {
				if done[i].IsZero() {
					short = append(short, fmt.Sprintf("%s credited %d of %d", s.s.Name, last[i], s.sum))
				}
			}
			return nil, fmt.Errorf("no progress for 2 minutes after %v: %s\n%s", time.Since(start).Round(time.Second), strings.Join(short, ", "), cons.logs())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// consumers are a row's shard consumers, as processes or in this process.
type consumers struct {
	mu    sync.Mutex
	cmds  []*exec.Cmd
	out   []*lockedBuffer
	errs  []error
	exits chan int
	// In this process:
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	stopped bool
}

// lockedBuffer collects a consumer's log.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 64<<10 { // the start says why it failed; keep memory bounded
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startConsumers runs `consumer -shards FILE -shard NAME` for each shard:
// the production command, with the bench's batch and in-flight.
func (b *shardsBench) startConsumers(ctx context.Context, exe string, shards []*shardDB, argsOf func(*shardDB) []string) (*consumers, error) {
	c := &consumers{exits: make(chan int, len(shards)), errs: make([]error, len(shards))}
	if exe == "" {
		ctx, c.cancel = context.WithCancel(ctx)
	}
	for i, s := range shards {
		args := append(argsOf(s), "-http", "", "-batch", strconv.Itoa(b.o.Batch),
			"-inflight", strconv.Itoa(b.o.InFlight), "-log-format", "json")
		log := &lockedBuffer{}
		c.out = append(c.out, log)
		if exe != "" {
			cmd := exec.CommandContext(ctx, exe, args...)
			// Only the server's URL: no NATS context or credentials of
			// the caller's environment reach the child.
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "NATS_URL=" + b.natsURL}
			cmd.Stdout, cmd.Stderr = log, log
			if err := cmd.Start(); err != nil {
				c.stop()
				return nil, fmt.Errorf("start consumer of shard %s: %w", s.s.Name, err)
			}
			c.cmds = append(c.cmds, cmd)
			go func() {
				err := cmd.Wait()
				c.mu.Lock()
				c.errs[i] = fmt.Errorf("consumer of shard %s exited: %v", s.s.Name, err)
				c.mu.Unlock()
				c.exits <- i
			}()
			continue
		}
		env := func(k string) string {
			if k == "NATS_URL" {
				return b.natsURL
			}
			return ""
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			err := cli.Consumer(ctx, args[1:], env, log, log)
			c.mu.Lock()
			if !c.stopped {
				c.errs[i] = fmt.Errorf("consumer of shard %s returned: %v", s.s.Name, err)
			}
			c.mu.Unlock()
		}()
	}
	return c, nil
}

// failed reports a consumer that stopped before the row ended.
func (c *consumers) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, err := range c.errs {
		if err != nil {
			return fmt.Errorf("%w\n%s", err, c.out[i].String())
		}
	}
	return nil
}

func (c *consumers) logs() string {
	var b strings.Builder
	for i, l := range c.out {
		fmt.Fprintf(&b, "consumer %d:\n%s\n", i, l.String())
	}
	return b.String()
}

// cpu returns the CPU each consumer process used so far (zeros in this
// process: its CPU is the process's).
func (c *consumers) cpu() []time.Duration {
	out := make([]time.Duration, len(c.out))
	for i, cmd := range c.cmds {
		out[i] = procstat.CPU(cmd.Process.Pid)
	}
	return out
}

// stop ends the consumers (SIGTERM: they drain) and waits for them.
func (c *consumers) stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.mu.Unlock()
	if c.cancel != nil {
		c.cancel()
		c.wg.Wait()
		return nil
	}
	for _, cmd := range c.cmds {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	var errs []error
	for range c.cmds {
		select {
		case <-c.exits:
		case <-time.After(30 * time.Second):
			for _, cmd := range c.cmds {
				_ = cmd.Process.Kill()
			}
			errs = append(errs, errors.New("consumers did not stop within 30s of SIGTERM"))
			return errors.Join(errs...)
		}
	}
	return nil
}

// postmasterPID is the PID of the server's postmaster: the parent of a
// backend.
func postmasterPID(ctx context.Context, pg *testenv.Postgres) (int, error) {
	pool, err := pgxpool.New(ctx, pg.URL("postgres"))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, fmt.Errorf("bench -shards: %w", err)
	}
	st, err := procstat.Read(backend)
	if err != nil {
		return 0, fmt.Errorf("bench -shards: the postmaster of backend %d: %w", backend, err)
	}
	return st.PPID, nil
}

// treeCPU is the CPU a PostgreSQL server used so far: the postmaster's own,
// that of its children already exited (a closed connection's backend,
// an autovacuum worker), and that of its children alive now.
func treeCPU(postmaster int) time.Duration {
	st, err := procstat.Read(postmaster)
	if err != nil {
		return 0
	}
	total := st.Self + st.Children
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		if c, err := procstat.Read(pid); err == nil && c.PPID == postmaster {
			total += c.Self
		}
	}
	return total
}

// Costs are the per-message costs a row measured, summed over its shards.
type Costs struct {
	// PG: the shards' PostgreSQL servers. Consumer: the consumer
	// processes (zero when in this process). Process: this process while
	// consuming (the nats-server delivering and taking acks, and the
	// consumers when in this process). Store: this process while the
	// messages were published (the nats-server storing them, and the
	// publisher's client).
	PG, Consumer, Process, Store time.Duration
	WALBytes                     float64
}

// NATS is what the model charges the NATS host per message: storing,
// delivering and taking the ack. It is high by the publisher's client
// (and by the consumers when they ran in this process).
func (c Costs) NATS() time.Duration { return c.Store + c.Process }

// costs of round r of the row, per message.
func (r ShardsRound) costs(store time.Duration) Costs {
	var c Costs
	n := 0
	for _, s := range r.Shards {
		c.PG += s.PGCPU
		c.Consumer += s.ConsumerCPU
		c.WALBytes += s.WALBytes
		n += s.Msgs
	}
	d := time.Duration(max(n, 1))
	c.PG, c.Consumer, c.Process, c.Store = c.PG/d, c.Consumer/d, r.ProcCPU/d, store
	c.WALBytes /= float64(max(n, 1))
	return c
}

// medianCosts is the median over rounds of each cost.
func (row ShardsRow) medianCosts(store time.Duration) Costs {
	var pg, cons, proc, wal []float64
	for _, r := range row.Rounds {
		c := r.costs(store)
		pg, cons, proc, wal = append(pg, float64(c.PG)), append(cons, float64(c.Consumer)), append(proc, float64(c.Process)), append(wal, c.WALBytes)
	}
	return Costs{PG: time.Duration(median(pg)), Consumer: time.Duration(median(cons)), Process: time.Duration(median(proc)), Store: store, WALBytes: median(wal)}
}

func (row ShardsRow) cores() float64 {
	v := make([]float64, len(row.Rounds))
	for i, r := range row.Rounds {
		v[i] = r.Cores()
	}
	return median(v)
}

func (row ShardsRow) rates() []float64 {
	out := make([]float64, len(row.Rounds))
	for i, r := range row.Rounds {
		out[i] = r.Rate()
	}
	return out
}

// ModelRow is the model's aggregate on some number of hosts.
type ModelRow struct {
	Hosts int
	// Aggregate is the rate of all hosts, PerHost each one's share.
	Aggregate, PerHost float64
	// NATSBound: the shared NATS ceiling binds, not the hosts'
	// PostgreSQL.
	NATSBound bool
	// ConsumerCores: the consumers' CPU the aggregate takes (they run
	// anywhere; they hold no state). WALMBps: each host's WAL rate.
	ConsumerCores, WALMBps float64
	// NATSCoresNeeded: the NATS cores that would keep every host busy.
	NATSCoresNeeded float64
}

// Model is the aggregate for N hosts, each with its own PostgreSQL, from
// measured per-message costs: each host applies at most HostCores / its
// PostgreSQL's CPU per message, and every message also costs the one NATS
// host (the stream's leader) its CPU per message, the shared ceiling.
type Model struct {
	Costs     Costs
	HostCores int
	NATSCores int
}

// HostCeiling is one host's rate, bound by its PostgreSQL's CPU.
func (m Model) HostCeiling() float64 {
	return float64(m.HostCores) / m.Costs.PG.Seconds()
}

// NATSCeiling is the rate at which the NATS host's cores are all busy.
func (m Model) NATSCeiling() float64 {
	return float64(m.NATSCores) / m.Costs.NATS().Seconds()
}

// HostsBound is the most hosts whose PostgreSQL still binds before NATS
// does: 0 when NATS binds from the first host.
func (m Model) HostsBound() int {
	return int(math.Floor(m.NATSCeiling() / m.HostCeiling()))
}

// Row is the model at hosts hosts.
func (m Model) Row(hosts int) ModelRow {
	agg := float64(hosts) * m.HostCeiling()
	r := ModelRow{Hosts: hosts, NATSCoresNeeded: agg * m.Costs.NATS().Seconds()}
	if nc := m.NATSCeiling(); nc < agg {
		agg, r.NATSBound = nc, true
	}
	r.Aggregate, r.PerHost = agg, agg/float64(hosts)
	r.ConsumerCores = agg * m.Costs.Consumer.Seconds()
	r.WALMBps = r.PerHost * m.Costs.WALBytes / 1e6
	return r
}

// OneMachine is the model's rate with everything (PostgreSQL, consumers,
// NATS) on one host of HostCores: what the 1-shard row measured, if the
// costs add up.
func (m Model) OneMachine() float64 {
	c := m.Costs
	return float64(m.HostCores) / (c.PG + c.Consumer + c.NATS()).Seconds()
}

// Model returns the model from the first row (the fewest shards: one
// host's PostgreSQL applying everything at full speed, which is what each
// host does in the model).
func (r *ShardsResult) Model() Model { return r.modelOf(r.firstShardRow()) }

// modelOf is the model from row i.
func (r *ShardsResult) modelOf(i int) Model {
	return Model{Costs: r.Rows[i].medianCosts(r.PublishCPU), HostCores: r.Opts.HostCores, NATSCores: r.Opts.NATSCores}
}

func us(d time.Duration) string { return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond)) }

// Write prints the rows, each shard, and the model.
func (r *ShardsResult) Write(w io.Writer) {
	o := r.Opts
	src, dest := r.basemap().SubjectTransform()
	where := "as `jetinbox consumer -shards FILE -shard NAME` processes"
	if !o.Processes {
		where = "`consumer -shards FILE -shard NAME` in this process (consumer and nats-server CPU not told apart)"
	}
	fmt.Fprintf(w, "\njetinbox bench -shards: %d messages over %d accounts, %d partitions, batch ≤ %d, %d in flight per shard (per partition in the per-partition rows), %d round(s), median\n",
		o.N, o.Accounts, o.Partitions, o.Batch, o.InFlight, o.Rounds)
	fmt.Fprintf(w, "stream %s: transform %s → %s (sync_interval always: %v); each shard its own PostgreSQL (fsync on); consumers %s\n",
		r.basemap().Stream, src, dest, o.SyncAlways, where)
	fmt.Fprintf(w, "producer: %.0f msg/s into the sharded stream, %s CPU per message stored (nats-server and the publisher's client)\n\n", r.PublishRate, us(r.PublishCPU))
	base := r.Rows[0]
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	vs := "vs " + base.label()
	fmt.Fprintf(tw, "shards\tmsg/s\t%s\tper shard msg/s\tCPU/msg: PostgreSQL\tconsumers\tnats-server%s\tWAL/msg\tcores used\tPostgreSQL vs 1 durable\tnats-server vs 1 durable\t\n", vs, map[bool]string{false: "+consumers"}[o.Processes])
	for _, row := range r.Rows {
		c := row.medianCosts(r.PublishCPU)
		cons := us(c.Consumer)
		if !o.Processes {
			cons = "-"
		}
		pgR, natsR := "-", "-"
		if p, n, ok := r.costRatios(row); ok && row.Mode != modeOneDurable {
			pgR, natsR = p.String(), n.String()
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%.0f B\t%.2f of %d\t%s\t%s\t\n", row.label(), median(row.rates()), ratios(row.rates(), base.rates()),
			strings.Join(row.perShardRates(), " "), us(c.PG), cons, us(c.Process), c.WALBytes, row.cores(), runtime.NumCPU(), pgR, natsR)
	}
	tw.Flush()
	fmt.Fprintln(w, "\neach shard (median over rounds): its partitions, messages, rate until its last message, its PostgreSQL's CPU and WAL per message, messages per committed transaction")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shards\tshard\tpartitions\tmessages\tmsg/s\tPostgreSQL CPU/msg\tconsumer CPU/msg\tWAL/msg\tmsgs/transaction\t")
	for _, row := range r.Rows {
		for j := range row.Shards {
			var rate, pg, cons, wal, perTx []float64
			for _, rd := range row.Rounds {
				s := rd.Shards[j]
				perTx = append(perTx, float64(s.Msgs)/float64(max(s.Transactions, 1)))
				rate = append(rate, float64(s.Msgs)/s.Elapsed.Seconds())
				pg = append(pg, float64(s.PGCPU)/float64(s.Msgs))
				cons = append(cons, float64(s.ConsumerCPU)/float64(s.Msgs))
				wal = append(wal, s.WALBytes/float64(s.Msgs))
			}
			s := row.Rounds[0].Shards[j]
			consS := us(time.Duration(median(cons)))
			if !o.Processes {
				consS = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.0f\t%s\t%s\t%.0f B\t%.0f\t\n", row.label(), s.Name, s.Partitions, s.Msgs, median(rate),
				us(time.Duration(median(pg))), consS, median(wal), median(perTx))
		}
	}
	tw.Flush()
	r.writeModel(w, r.firstShardRow())
	if i := r.firstRowOf(modeShardDurables); i >= 0 {
		r.writeModel(w, i)
	}
	if r.Verified {
		fmt.Fprintln(w, "\nledgers verified after every row: each shard applied exactly its partitions' messages, once, balances exact; verify -shards clean")
	}
}

func (row ShardsRow) perShardRates() []string {
	out := make([]string, row.Shards)
	for j := range row.Shards {
		var v []float64
		for _, rd := range row.Rounds {
			v = append(v, float64(rd.Shards[j].Msgs)/rd.Shards[j].Elapsed.Seconds())
		}
		out[j] = fmt.Sprintf("%.0f", median(v))
	}
	return out
}

func (r *ShardsResult) basemap() *shard.Map {
	m := (&shard.Map{Partitions: r.Opts.Partitions}).WithDefaults()
	return &m
}

func (r *ShardsResult) writeModel(w io.Writer, i int) {
	m := r.modelOf(i)
	c := m.Costs
	first := r.Rows[i]
	layout := "a durable per partition"
	if first.Mode == modeShardDurables {
		layout = "a durable per shard"
	}
	fmt.Fprintf(w, "\nmodel, %s: N hosts, each a shard's PostgreSQL (%d cores); one NATS host (%d cores) stores, delivers and takes the ack of every message\n", layout, m.HostCores, m.NATSCores)
	fmt.Fprintf(w, "inputs (the %s row, median):\n", first.label())
	fmt.Fprintf(w, "  PostgreSQL CPU per message    %9s  → a host applies at most %.0f msg/s\n", us(c.PG), m.HostCeiling())
	natsWhat := "store " + us(c.Store) + " + deliver and ack " + us(c.Process)
	if !r.Opts.Processes {
		natsWhat += " (with the consumers: high)"
	}
	fmt.Fprintf(w, "  NATS CPU per message          %9s  → the stream's ceiling %.0f msg/s (%s)\n", us(c.NATS()), m.NATSCeiling(), natsWhat)
	if r.Opts.Processes {
		fmt.Fprintf(w, "  consumer CPU per message      %9s  (stateless: runs on any machine, cores in the table)\n", us(c.Consumer))
	}
	fmt.Fprintf(w, "  WAL per message               %7.0f B  (each host's disk writes it)\n", c.WALBytes)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "hosts\taggregate msg/s\tper host\tbinds first\tNATS cores to keep the hosts busy\tconsumer cores\tWAL per host\t")
	for _, n := range r.Opts.ModelHosts {
		row := m.Row(n)
		binds := "the hosts' PostgreSQL"
		if row.NATSBound {
			binds = "NATS"
		}
		cores := fmt.Sprintf("%.1f", row.ConsumerCores)
		if !r.Opts.Processes {
			cores = "-"
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%s\t%.1f\t%s\t%.1f MB/s\t\n", n, row.Aggregate, row.PerHost, binds, row.NATSCoresNeeded, cores, row.WALMBps)
	}
	tw.Flush()
	if k := m.HostsBound(); k == 0 {
		fmt.Fprintf(w, "NATS binds from the first host: a message costs it %s against PostgreSQL's %s; each host past the first adds its %.0f msg/s only with %.1f more NATS cores\n",
			us(c.NATS()), us(c.PG), m.HostCeiling(), m.HostCeiling()*c.NATS().Seconds())
	} else {
		fmt.Fprintf(w, "the hosts' PostgreSQL binds up to %d host(s); from %d on NATS does, at %.0f msg/s, until it gets more cores or the stream is split\n", k, k+1, m.NATSCeiling())
	}
	fmt.Fprintf(w, "check: everything on one %d-core host, the model gives %.0f msg/s; the %s row measured %.0f keeping %.2f cores busy (the model counts CPU, not waits or other work on the machine)\n",
		m.HostCores, m.OneMachine(), first.label(), median(first.rates()), first.cores())
}
