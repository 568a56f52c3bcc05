// The sharded run: one stream partitioned by its subject transform, three
// shards each on its own PostgreSQL, a shard's database killed and a
// partition moved while intents flow, counted over all shards.

package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// ShardsOptions configures the sharded run.
type ShardsOptions struct {
	// Shards is how many shards, each with a PostgreSQL of its own.
	Shards int
	// Partitions is the stream's partition count.
	Partitions int
	// Intents is how many distinct intents are published.
	Intents int
	// LosePubAck is the fraction of PubAcks lost: the producer retries
	// with the same ID, half of the time on another kind subject.
	LosePubAck float64
	// Poison is the fraction of intents no effect can apply.
	Poison float64
	// Stray is how many intents are published again after the duplicate
	// window on each path that could take an ID to another partition: the
	// same subject, a key token derived from the account instead of the
	// ID, a dead letter re-driven on its stored subject and on its
	// publish subject, and IDs of the moved partition after the move.
	Stray int
	// KillPostgres SIGKILLs one shard's PostgreSQL mid-run and starts it
	// again; Move moves a partition between shards mid-run.
	KillPostgres, Move bool
	// RaceMoves, with Move, races the move: two moves of the partition to
	// two targets at once (the last shard and the second), then a rerun to
	// the target that lost; and a replay -apply of the source's partitions
	// that follows the stream through the move. Needs three shards.
	RaceMoves bool
	// Unsafe runs the moves with the check that is not safe (a resumed move
	// takes any given-away row; the target does not look at the source's
	// row) and the replay through the plain processor with the owned set
	// read at start, no fence: what the shipped checks stop.
	Unsafe bool
	// OnePostgres puts every shard's database on one PostgreSQL (tests:
	// cheaper to start); the killed one then takes all shards down.
	OnePostgres bool
	// Intake sends the intents through the HTTP first hop instead of
	// publishing them: an intake on a database of its own (partitioned
	// subjects), its relay, and a client that retries with the same key
	// when an answer is lost (at the LosePubAck rate), while the partition
	// moves.
	Intake bool
	// ShardDurables gives each shard one durable filtered on its
	// partitions (the map's shard_durables): a move hands the partition
	// over through a hand-off durable. Unsafe then moves without one.
	ShardDurables bool
	Seed          uint64
	Progress      io.Writer

	// Mutations, for the tests that show the checks go red.
	noBinding, noCopy bool
	// unsafeMoves and unsafeReplay are the two halves of Unsafe.
	unsafeMoves, unsafeReplay bool
	// keyFromSubject derives the key token from the intent's kind
	// subject instead of its ID, on both sides: producers key by subject
	// and consumers check that.
	keyFromSubject bool
}

// ShardsResult is the sharded run's count, per intent over all shards,
// and verify's own check of the end state.
type ShardsResult struct {
	Intents      int
	AppliedOnce  int
	Lost         int
	Duplicated   int
	InTwoShards  int
	Unexpected   int
	DeadLettered int
	// Faults done, by name.
	Faults []string
	Moved  string
	// MovedOwners are the shards that own the moved partition at the end:
	// exactly one, or the moves broke it.
	MovedOwners []string
	// MovesRefused counts the raced moves refused (the shipped check
	// refuses all but one); ReplayApplied and ReplayNotOwned count what the
	// replay during the move applied in the source and had refused there.
	MovesRefused, ReplayApplied, ReplayNotOwned int
	Unsafe                                      bool
	// ShardDurables: the run had one durable per shard.
	ShardDurables bool
	Verify        *verify.ShardsReport
	Elapsed       time.Duration
}

// Clean reports whether the count and verify both found nothing wrong, and
// the moved partition has one owner.
func (r *ShardsResult) Clean() bool {
	return r.Lost == 0 && r.Duplicated == 0 && r.Unexpected == 0 && r.Verify != nil && r.Verify.Clean() &&
		r.Verify.Lost == 0 && r.Verify.Duplicated == 0 && (r.MovedOwners == nil || len(r.MovedOwners) == 1)
}

// WriteShards prints the result.
func WriteShards(w io.Writer, r *ShardsResult) {
	fmt.Fprintf(w, "sharded: %d intents over %d shards (%s), %.1fs\n", r.Intents, len(r.Verify.AppliedIn), r.Moved, r.Elapsed.Seconds())
	fmt.Fprintf(w, "  applied once %d, lost %d %s, duplicated %d %s (in two shards %d), unexpected %d %s, dead-lettered %d\n",
		r.AppliedOnce, r.Lost, verify.Mark(r.Lost == 0), r.Duplicated, verify.Mark(r.Duplicated == 0), r.InTwoShards, r.Unexpected, verify.Mark(r.Unexpected == 0), r.DeadLettered)
	if r.MovedOwners != nil {
		fmt.Fprintf(w, "  moved partition owned by %v %s, raced moves refused %d, replay during the move: applied %d in the source, refused there %d\n",
			r.MovedOwners, verify.Mark(len(r.MovedOwners) == 1), r.MovesRefused, r.ReplayApplied, r.ReplayNotOwned)
	}
	fmt.Fprintf(w, "  faults: %s\n\nverify over all shards:\n", strings.Join(r.Faults, ", "))
	r.Verify.WriteTable(w)
}

// WriteShardsBeside prints the shipped run and the unsafe one side by side.
func WriteShardsBeside(w io.Writer, shipped, unsafe *ShardsResult) {
	fmt.Fprintln(w, "moves and a replay raced, shipped checks beside the unsafe ones:")
	fmt.Fprintf(w, "  %-74s %8s %6s %10s %13s %s\n", "setting", "applied", "lost", "duplicated", "in two shards", "owners of the moved partition")
	for _, r := range []*ShardsResult{shipped, unsafe} {
		name := "shipped (target recorded and re-checked; replay fenced)"
		if r.Unsafe {
			name = "unsafe (any given-away row; replay through plain processor)"
		}
		if r.ShardDurables {
			name = strings.Replace(strings.Replace(name, "(target", "(hand-off durable; target", 1), "(any", "(no hand-off; any", 1)
		}
		fmt.Fprintf(w, "  %-74s %8d %6d %10d %13d %v\n", name, r.AppliedOnce, r.Lost, r.Duplicated, r.InTwoShards, r.MovedOwners)
	}
}

// ShardsMain is `jetinbox chaos -shards N`.
func ShardsMain(ctx context.Context, n string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox chaos -shards", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := ShardsOptions{Progress: stderr}
	fs.IntVar(&o.Partitions, "partitions", shard.DefaultPartitions, "the stream's partition count")
	fs.IntVar(&o.Intents, "intents", 3000, "distinct intents")
	fs.Float64Var(&o.LosePubAck, "lose-puback", 0.03, "fraction of PubAcks lost (the producer retries with the same ID, half of the time on another subject)")
	fs.Float64Var(&o.Poison, "poison", 0.01, "fraction of intents no effect can apply (must end dead-lettered)")
	fs.IntVar(&o.Stray, "stray", 20, "intents published again after the duplicate window on each path that could reach another partition")
	fs.BoolVar(&o.KillPostgres, "kill", true, "SIGKILL one shard's PostgreSQL mid-run and start it again")
	fs.BoolVar(&o.Move, "move", true, "move a partition from the first shard to the last mid-run")
	fs.BoolVar(&o.RaceMoves, "race-moves", true, "with -move: two moves of the partition to two targets at once, a rerun to the other, and a replay -apply of the source through the move (3 shards or more)")
	beside := fs.Bool("beside-unsafe", false, "run again with the unsafe move check and replay (any given-away row; no fence in the replay) and print both")
	fs.BoolVar(&o.ShardDurables, "shard-durables", false, "one durable per shard filtered on its partitions, a hand-off durable per move (the unsafe run: moves without it)")
	fs.BoolVar(&o.Intake, "intake", false, "post the intents through an HTTP intake (its own database, partitioned subjects, lost answers retried with the same key) instead of publishing them")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed for the fault dice")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox chaos -shards N: one stream partitioned by its subject transform, N shards each on its own\n"+
			"PostgreSQL, lost PubAcks, poison intents, strays after the duplicate window, a shard's PostgreSQL killed and a\n"+
			"partition moved mid-run; lost, duplicated and unexpected counted over all shards, then verify -shards.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if o.Shards, err = strconv.Atoi(n); err != nil {
		return cli.UsageError{Err: fmt.Errorf("chaos: -shards %q: want a number of shards", n)}
	}
	if err := o.validate(fs.NArg()); err != nil {
		return cli.UsageError{Err: fmt.Errorf("chaos: %w", err)}
	}
	if o.RaceMoves && (!o.Move || o.Shards < 3) {
		o.RaceMoves = false // nothing to race, or no second target
	}
	r, err := RunShards(ctx, o)
	if err != nil {
		return err
	}
	WriteShards(stdout, r)
	if *beside {
		u := o
		u.Unsafe = true
		ur, err := RunShards(ctx, u)
		if err != nil {
			return fmt.Errorf("chaos: the unsafe run: %w", err)
		}
		fmt.Fprintln(stdout, "\nthe unsafe run:")
		WriteShards(stdout, ur)
		fmt.Fprintln(stdout)
		WriteShardsBeside(stdout, r, ur)
	}
	if !r.Clean() {
		return errors.New("chaos: the sharded run lost, duplicated or added intents, or verify found violations")
	}
	return nil
}

func (o ShardsOptions) validate(extra int) error {
	var errs []error
	if o.Shards < 2 || o.Shards > 8 {
		errs = append(errs, fmt.Errorf("-shards %d: want 2 to 8", o.Shards))
	}
	if o.Partitions < o.Shards || o.Partitions > 1024 {
		errs = append(errs, fmt.Errorf("-partitions %d: want -shards to 1024", o.Partitions))
	}
	if o.Intents < 1 {
		errs = append(errs, fmt.Errorf("-intents %d: must be at least 1", o.Intents))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"lose-puback", o.LosePubAck}, {"poison", o.Poison}} {
		if !(f.v >= 0 && f.v < 1) {
			errs = append(errs, fmt.Errorf("-%s %v: want a fraction in [0, 1)", f.name, f.v))
		}
	}
	if o.Stray < 0 || o.Stray > o.Intents {
		errs = append(errs, fmt.Errorf("-stray %d: want 0 to -intents", o.Stray))
	}
	if extra > 0 {
		errs = append(errs, errors.New("unexpected arguments"))
	}
	return errors.Join(errs...)
}

// dupWindow is the sharded stream's duplicate window in this run: short,
// so that strays published after it are stored, not dropped by ID.
const dupWindow = time.Second

type shardRun struct {
	o       ShardsOptions
	m       *shard.Map
	js      jetstream.JetStream
	pgs     []*testenv.Postgres // one per shard, or one for all
	pools   []*pgxpool.Pool
	dice    *rand.Rand
	diceMu  sync.Mutex
	faults  map[string]int
	faultMu sync.Mutex
	fps     []*failpoint.Set // the partition consumers' crash points
	refused int              // raced moves refused
	log     *slog.Logger
}

// side is shard i of the run, for a move.
func (r *shardRun) side(i int) shard.Side {
	return shard.Side{Name: r.m.Shards[i].Name, Pool: r.pools[i]}
}

func (r *shardRun) roll(p float64) bool {
	r.diceMu.Lock()
	defer r.diceMu.Unlock()
	return r.dice.Float64() < p
}

func (r *shardRun) fault(name string, n int) {
	r.faultMu.Lock()
	r.faults[name] += n
	r.faultMu.Unlock()
}

func (r *shardRun) progress(format string, args ...any) {
	if r.o.Progress != nil {
		fmt.Fprintf(r.o.Progress, "shards: "+format+"\n", args...)
	}
}

// RunShards runs the sharded pipeline under its faults and counts.
func RunShards(ctx context.Context, o ShardsOptions) (*ShardsResult, error) {
	start := time.Now()
	if o.Partitions == 0 {
		o.Partitions = shard.DefaultPartitions
	}
	if o.Unsafe {
		o.unsafeMoves, o.unsafeReplay = true, true
	}
	if o.RaceMoves && (!o.Move || o.Shards < 3) {
		return nil, errors.New("chaos: -race-moves needs -move and three shards")
	}
	r := &shardRun{o: o, dice: rand.New(rand.NewPCG(o.Seed, 0x5ba4d)), faults: map[string]int{},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	nsrv, err := natsenv.StartNATS(natsenv.NATSOptions{})
	if err != nil {
		return nil, err
	}
	defer nsrv.Close()
	nc, err := nats.Connect(nsrv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	r.js, _ = jetstream.New(nc)

	// The map: partitions dealt out in runs, a PostgreSQL per shard.
	m := (&shard.Map{Partitions: o.Partitions, ShardDurables: o.ShardDurables}).WithDefaults()
	for i := range o.Shards {
		if i == 0 || !o.OnePostgres {
			pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
			if err != nil {
				return nil, err
			}
			defer pg.Close()
			r.pgs = append(r.pgs, pg)
		}
		url, err := r.pgs[len(r.pgs)-1].CreateDatabase(ctx, fmt.Sprintf("shard_%d", i))
		if err != nil {
			return nil, err
		}
		var set shard.Set
		for p := i * o.Partitions / o.Shards; p < (i+1)*o.Partitions/o.Shards; p++ {
			set = append(set, p)
		}
		m.Shards = append(m.Shards, shard.Shard{Name: "s" + strconv.Itoa(i), DatabaseURL: url, Partitions: set})
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	r.m = &m
	for _, s := range m.Shards {
		pool, err := pginbox.NewPool(ctx, s.DatabaseURL+"&pool_max_conns=12")
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		r.pools = append(r.pools, pool)
		if _, err := pginbox.New(pool).Migrate(ctx); err != nil {
			return nil, err
		}
		if _, err := effects.Migrate(ctx, pool); err != nil {
			return nil, err
		}
		if err := effects.SeedAccounts(ctx, pool, 64); err != nil {
			return nil, err
		}
		if _, err := shard.Migrate(ctx, pool, r.m, s.Name); err != nil {
			return nil, err
		}
	}
	if err := r.m.EnsureStream(ctx, r.js, jsinbox.StreamConfig{DuplicateWindow: dupWindow}); err != nil {
		return nil, err
	}

	// The shards' runners.
	rctx, stopRunners := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopRunners(); wg.Wait() }()
	for i := range m.Shards {
		if err := r.startShard(rctx, &wg, i); err != nil {
			return nil, err
		}
	}

	intents := pipeline.Generate(pipeline.Load{Count: o.Intents, Accounts: 64, Prefix: fmt.Sprintf("sh%d", o.Seed), Seed: o.Seed})
	kinds := make([]string, len(intents))
	for i := range intents {
		kinds[i] = strings.Replace(intents[i].Subject, "intents.", "ledger.", 1)
	}
	if o.Poison > 0 {
		every := max(1, int(1/o.Poison))
		for i := every / 2; i < len(intents); i += every {
			intents[i].Payload = []byte(`{"account":1,"amount":`)
			r.fault("poison intents", 1)
		}
	}
	// The partition to move: the first shard's first, taken from it while
	// intents flow (once some were applied there) and given to the last.
	moveP := m.Shards[0].Partitions[0]
	moved := "no partition moved"
	var moveErr error
	var moveOnce sync.Once
	var replayWG sync.WaitGroup
	replayCtx, stopReplay := context.WithCancel(ctx)
	defer func() { stopReplay(); replayWG.Wait() }()
	var replayed replayCounts
	doMove := func() {
		moveOnce.Do(func() {
			if o.RaceMoves {
				// The replay follows the source's partitions through the
				// move, as an operator's replay -apply of a long range.
				started := make(chan struct{})
				replayWG.Add(1)
				go func() {
					defer replayWG.Done()
					if err := r.replayDuringMove(replayCtx, moveP, started, &replayed); err != nil && replayCtx.Err() == nil {
						r.progress("replay during the move: %v", err)
					}
				}()
				<-started
			}
			r.waitApplied(ctx, moveP)
			last := len(r.pools) - 1
			mo := shard.MoveOptions{UnsafeAnyGivenAway: o.unsafeMoves, JS: r.js, UnsafeNoHandOff: o.unsafeMoves && o.ShardDurables}
			var res shard.MoveResult
			var err error
			winner := last
			switch {
			case o.noCopy:
				err = moveWithoutRows(ctx, r.m, moveP, r.pools[0], r.pools[last])
			case o.RaceMoves:
				winner, res, err = r.raceMoves(ctx, moveP, mo)
			default:
				res, err = shard.MoveWith(ctx, r.m, moveP, r.side(0), r.side(last), mo)
			}
			if err != nil {
				moveErr = err
				return
			}
			nm, err := r.m.Move(moveP, m.Shards[winner].Name)
			if err != nil {
				moveErr = err
				return
			}
			r.m = nm
			moved = fmt.Sprintf("partition %d moved s0 → s%d with %d inbox rows", moveP, winner, res.Copied)
			r.fault("partition moves", 1)
			r.progress("%s", moved)
		})
	}
	var si *shardIntake
	keys := make([]string, len(intents))
	if o.Intake {
		if si, err = r.startIntake(ctx); err != nil {
			return nil, err
		}
		defer si.stop()
		for i := range intents {
			keys[i] = intents[i].ID
			intents[i].ID = shardIntakeID(keys[i])
		}
	}
	killed := 1 % o.Shards
	for i := range intents {
		switch {
		case o.Move && i == len(intents)/3:
			if si != nil {
				// What was posted so far is in the stream (and, below,
				// applied) before the partition moves, so the move has
				// rows to carry and the retries after it meet them.
				if err := si.drained(ctx); err != nil {
					return nil, err
				}
			}
			doMove()
		case o.KillPostgres && i == 2*len(intents)/3:
			pg := r.pgs[min(killed, len(r.pgs)-1)]
			// Every process of the server at once, as a crash of its
			// host would: the backends do not outlive the postmaster.
			r.progress("SIGKILL the PostgreSQL of shard s%d", killed)
			if err := pg.KillAll(); err != nil {
				return nil, err
			}
			time.Sleep(300 * time.Millisecond)
			if err := pg.Start(ctx); err != nil {
				return nil, err
			}
			r.fault("PostgreSQL kills", 1)
		}
		if si != nil {
			if err := si.post(ctx, keys[i], r.m.Subject+"."+kinds[i], intents[i].Payload); err != nil {
				return nil, err
			}
			continue
		}
		if err := r.publish(ctx, intents[i].ID, r.publishSubject(intents[i].ID, kinds[i]), intents[i].Payload, true); err != nil {
			return nil, err
		}
	}
	if si != nil && o.Move {
		// The clients of the moved partition's intents retry after the
		// move with their keys: the intake, whose keys did not move,
		// answers them again and adds nothing.
		for i := range intents[:len(intents)/3] {
			if shard.PartitionOf(intents[i].ID, r.m.Partitions) != moveP {
				continue
			}
			if err := si.post(ctx, keys[i], r.m.Subject+"."+kinds[i], intents[i].Payload); err != nil {
				return nil, err
			}
			r.fault("re-posts after the move", 1)
		}
	}
	if si != nil {
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := si.drained(dctx)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	if moveErr != nil {
		return nil, fmt.Errorf("move: %w", moveErr)
	}
	if err := r.strays(ctx, intents, kinds, moveP); err != nil {
		return nil, err
	}
	r.progress("published; waiting for every partition to settle")
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	err = r.waitSettled(sctx)
	cancel()
	stopReplay()
	replayWG.Wait()
	stopRunners()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	for _, p := range r.pools {
		p.Reset() // connections the kill ended may pass for alive
	}
	res := &ShardsResult{Intents: len(intents), Moved: moved, Unsafe: o.Unsafe, ShardDurables: o.ShardDurables, MovesRefused: r.refused,
		ReplayApplied: int(replayed.applied.Load()), ReplayNotOwned: int(replayed.notOwned.Load())}
	if o.Move {
		res.MovedOwners = []string{}
		for i, s := range m.Shards {
			var owned bool
			if err := r.pools[i].QueryRow(ctx, `SELECT coalesce((SELECT owned FROM jetinbox_partitions WHERE scope = $1 AND partition = $2), false)`, r.m.Scope, moveP).Scan(&owned); err != nil {
				return nil, err
			}
			if owned {
				res.MovedOwners = append(res.MovedOwners, s.Name)
			}
		}
	}
	if err := r.count(ctx, intents, res); err != nil {
		return nil, err
	}
	dbs := make([]verify.ShardDB, len(r.m.Shards))
	for i, s := range r.m.Shards {
		dbs[i] = verify.ShardDB{Name: s.Name, DB: r.pools[i]}
	}
	if res.Verify, err = verify.Shards(ctx, r.js, r.m.Stream, r.m.Scope, dbs, r.m.ConsumerDurables()...); err != nil {
		return nil, err
	}
	for _, fp := range r.fps {
		r.fault("lost acks", fp.Hits(failpoint.SkipAck))
		r.fault("crashes after commit", fp.Hits(failpoint.AfterCommit))
	}
	for _, f := range []string{"lost PubAcks", "retries on another subject", "poison intents", "crashes after commit", "lost acks", "PostgreSQL kills", "partition moves",
		"replays after the window", "keys from the account", "re-drives on the stored subject", "re-drives on the publish subject", "copies on another kind", "replays of the moved partition", "raced moves", "replays during the move", "lost intake answers", "re-posts after the move"} {
		res.Faults = append(res.Faults, fmt.Sprintf("%d %s", r.faults[f], f))
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// startShard runs shard i's runner, with lost acks and a crash after a
// COMMIT armed on its partition consumers.
func (r *shardRun) startShard(ctx context.Context, wg *sync.WaitGroup, i int) error {
	pool := r.pools[i]
	led, err := effects.NewScopedLedger(r.m.Scope)
	if err != nil {
		return err
	}
	inner, err := inbox.NewProcessor(pginbox.New(pool), inbox.Handler[pgx.Tx](&shard.Fenced{Map: r.m, Inner: led}), inbox.Config{Scope: r.m.Scope, Logger: r.log})
	if err != nil {
		return err
	}
	// A few batches of the shard die between COMMIT and ack.
	pfp := failpoint.New()
	pfp.EnableEvery(failpoint.AfterCommit, 25, 2)
	pfp.Attach(inner)
	r.faultMu.Lock()
	r.fps = append(r.fps, pfp)
	r.faultMu.Unlock()
	proc := shard.NewProcessor(inner, r.m)
	var bp jsinbox.BatchProcessor = proc
	switch {
	case r.o.noBinding:
		bp = unbound{proc, nil}
	case r.o.keyFromSubject:
		bp = unbound{proc, func(ps shard.Parsed) bool {
			return ps.Key == shard.Key(ps.Rest) && ps.Partition == shard.Partition(ps.Key, r.m.Partitions)
		}}
	}
	run := &shard.Runner{JS: r.js, Pool: pool, Map: r.m, Name: r.m.Shards[i].Name, Proc: proc, Batch: bp, Logger: r.log, Poll: 200 * time.Millisecond,
		Consumer: jsinbox.ConsumerConfig{BatchSize: 200, InFlight: 1, AckWait: 2 * time.Second, MaxDeliver: 50},
		OnConsumer: func(p int, c *jsinbox.Consumer) {
			fp := failpoint.New()
			fp.EnableEvery(failpoint.SkipAck, 7, -1)
			fp.Attach(c)
			r.faultMu.Lock()
			r.fps = append(r.fps, fp)
			r.faultMu.Unlock()
		}}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := run.Run(ctx); err != nil {
			r.progress("shard %d: %v", i, err)
		}
	}()
	return nil
}

// publish publishes one copy until the stream acknowledged it; a lost
// PubAck is retried with the same ID, half of the time on another kind
// (same key token: same partition).
func (r *shardRun) publish(ctx context.Context, id, subject string, payload []byte, faults bool) error {
	for attempt := 0; ; attempt++ {
		if attempt > 50 {
			return fmt.Errorf("publish %s: no PubAck after %d attempts", id, attempt)
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := r.js.PublishMsg(pctx, &nats.Msg{Subject: subject, Data: payload, Header: nats.Header{jetstream.MsgIDHeader: {id}}})
		cancel()
		if err == nil && !(faults && r.roll(r.o.LosePubAck)) {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			r.fault("lost PubAcks", 1)
			if r.roll(0.5) {
				subject += "x" // the same key, another kind
				r.fault("retries on another subject", 1)
			}
		}
		time.Sleep(time.Duration(rand.Int64N(int64(10 * time.Millisecond))))
	}
}

// strays publishes, after the duplicate window, copies of applied intents
// on every path that could put an ID in another partition. Each must end
// a duplicate or dead-lettered, never a second effect.
func (r *shardRun) strays(ctx context.Context, intents []inbox.Intent, kinds []string, moveP int) error {
	if r.o.Stray == 0 {
		return nil
	}
	time.Sleep(dupWindow + 200*time.Millisecond)
	subj := r.m.Subject
	var inMoved []int
	for i := range intents {
		if shard.PartitionOf(intents[i].ID, r.m.Partitions) == moveP && i < len(intents)/3 {
			inMoved = append(inMoved, i)
		}
	}
	// Each path gets IDs of its own: two copies of one ID within the
	// window would be one stored message.
	for k := range r.o.Stray {
		paths := []string{"replays after the window", "keys from the account", "re-drives on the stored subject", "re-drives on the publish subject", "copies on another kind"}
		for c, fault := range paths {
			i := ((k*len(paths) + c) * 7919) % len(intents)
			id, payload := intents[i].ID, intents[i].Payload
			subject := r.publishSubject(id, kinds[i])
			ps, _ := shard.ParseStored(subj, subject[:len(subj)+1]+"0."+subject[len(subj)+1:])
			stored := fmt.Sprintf("%s.%d.%s.%s", subj, shard.Partition(ps.Key, r.m.Partitions), ps.Key, kinds[i])
			switch c {
			case 1:
				// A producer that keys by account: its copies of one ID
				// land in the account's partition.
				acct := kinds[i][strings.LastIndexByte(kinds[i], '.')+1:]
				subject = subj + "." + shard.Key("account-"+acct) + "." + kinds[i]
			case 2:
				// A re-drive that publishes the stored subject: the
				// transform inserts a second partition token.
				subject = stored
			case 3:
				subject, _ = shard.Unstored(subj, stored)
			case 4:
				// The same ID and payload on another kind: a conflict in
				// the ID's own partition, never an apply elsewhere.
				subject = r.publishSubject(id, kinds[i]+"x")
			}
			if err := r.publish(ctx, id, subject, payload, false); err != nil {
				return err
			}
			r.fault(fault, 1)
		}
		if k < len(inMoved) {
			j := inMoved[k]
			if err := r.publish(ctx, intents[j].ID, r.publishSubject(intents[j].ID, kinds[j]), intents[j].Payload, false); err != nil {
				return err
			}
			r.fault("replays of the moved partition", 1)
		}
	}
	return nil
}

// publishSubject is where the producer publishes an intent: on its ID's
// key, or, in the mutation, on its kind's.
func (r *shardRun) publishSubject(id, kind string) string {
	if r.o.keyFromSubject {
		return r.m.Subject + "." + shard.Key(kind) + "." + kind
	}
	return shard.PublishSubject(r.m.Subject, id, kind)
}

// waitApplied waits until partition p's durable has caught up with what
// was published so far, so that the move has inbox rows to carry (other
// partitions keep running meanwhile).
func (r *shardRun) waitApplied(ctx context.Context, p int) {
	deadline := time.Now().Add(10 * time.Second)
	durable := r.m.Durable(p)
	if r.m.ShardDurables {
		durable = r.m.ShardDurable(r.m.Shards[0].Name)
	}
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if done, _ := r.settled(ctx, durable); done {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitSettled waits until every partition's durable has nothing pending
// or awaiting an ack, and its rescue durable nothing either.
//
// With one durable per shard: every shard's durable, once no hand-off
// durable is left.
func (r *shardRun) waitSettled(ctx context.Context) error {
	durables := r.m.ConsumerDurables()
	if r.m.ShardDurables {
		for p := range r.m.Partitions {
			for {
				_, err := r.js.Consumer(ctx, r.m.Stream, r.m.HandOff(p))
				if errors.Is(err, jetstream.ErrConsumerNotFound) {
					break
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("partition %d's hand-off did not end (%v): %w", p, err, ctx.Err())
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}
	for _, d := range durables {
		for {
			done, why := r.settled(ctx, d)
			if done {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("durable %s did not settle: %s: %w", d, why, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func (r *shardRun) settled(ctx context.Context, durable string) (bool, string) {
	c, err := r.js.Consumer(ctx, r.m.Stream, durable)
	if err != nil {
		return false, err.Error()
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, err.Error()
	}
	if info.NumPending > 0 || info.NumAckPending > 0 {
		return false, fmt.Sprintf("%d pending, %d awaiting an ack", info.NumPending, info.NumAckPending)
	}
	rc, err := r.js.Consumer(ctx, jsinbox.AdvisoryStream(r.m.Stream), durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return true, ""
	}
	if err != nil {
		return false, err.Error()
	}
	ri, err := rc.Info(ctx)
	if err != nil || ri.NumPending > 0 || ri.NumAckPending > 0 {
		return false, "advisories to rescue"
	}
	return true, ""
}

// count reads the ledger entries of every shard per intent: none is lost
// (or dead-lettered when the dead-letter stream has it), one is applied
// once, more is duplicated; an entry of no intent is unexpected.
func (r *shardRun) count(ctx context.Context, intents []inbox.Intent, res *ShardsResult) error {
	dead, err := verify.ReadStream(ctx, r.js, jsinbox.DeadLetterStream(r.m.Stream))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	deadIDs := map[string]bool{}
	for _, d := range dead {
		deadIDs[d.Header[jsinbox.HeaderMessageID]] = true
	}
	per := map[string]map[int]int{}
	for i, pool := range r.pools {
		rows, err := pool.Query(ctx, `SELECT message_id, count(*) FROM ledger_entries GROUP BY message_id`)
		if err != nil {
			return err
		}
		var id string
		var n int
		if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error {
			if per[id] == nil {
				per[id] = map[int]int{}
			}
			per[id][i] += n
			return nil
		}); err != nil {
			return err
		}
	}
	known := map[string]bool{}
	for _, in := range intents {
		known[in.ID] = true
		total := 0
		for _, n := range per[in.ID] {
			total += n
		}
		switch {
		case total == 0 && deadIDs[in.ID]:
			res.DeadLettered++
		case total == 0:
			res.Lost++
		case total == 1:
			res.AppliedOnce++
		default:
			res.Duplicated++
			if len(per[in.ID]) > 1 {
				res.InTwoShards++
			}
		}
	}
	for id := range per {
		if !known[id] {
			res.Unexpected++
		}
	}
	return nil
}

// unbound is the mutation without the binding check: a message goes to the
// effect if the partition its subject names is owned, whatever its ID. With
// bound set, it checks that instead (a binding to something else than the
// ID).
type unbound struct {
	*shard.Processor
	bound func(shard.Parsed) bool
}

func (u unbound) Process(ctx context.Context, msgs []inbox.Message) ([]inbox.Outcome, error) {
	m := u.Map()
	out := make([]inbox.Outcome, len(msgs))
	var keep []int
	for i := range msgs {
		ps, err := shard.ParseStored(m.Subject, msgs[i].Subject)
		switch {
		case err == nil && u.bound != nil && !u.bound(ps):
			err = fmt.Errorf("%w: key token not bound to the subject", shard.ErrBinding)
			out[i] = inbox.Outcome{Status: inbox.StatusRejected, Cause: inbox.CauseBadInput, Reason: err.Error(), Err: inbox.BadInput(err)}
		case err != nil:
			out[i] = inbox.Outcome{Status: inbox.StatusRejected, Cause: inbox.CauseBadInput, Reason: err.Error(), Err: inbox.BadInput(err)}
		case !u.Owns(ps.Partition):
			out[i] = inbox.Outcome{Status: inbox.StatusRetry, Cause: inbox.CauseTransient, Reason: "not owned", Err: shard.ErrNotOwned}
		default:
			keep = append(keep, i)
		}
	}
	if len(keep) == 0 {
		return out, nil
	}
	sub := make([]inbox.Message, len(keep))
	for j, i := range keep {
		sub[j] = msgs[i]
	}
	res, err := u.BatchProcessor.Process(ctx, sub)
	for j, i := range keep {
		if j < len(res) {
			out[i] = res[j]
		}
	}
	return out, err
}

// moveWithoutRows is the mutation of a move that takes the partition away
// and gives it on without copying its inbox rows.
func moveWithoutRows(ctx context.Context, m *shard.Map, p int, from, to *pgxpool.Pool) error {
	if _, err := from.Exec(ctx, `UPDATE jetinbox_partitions SET owned = false WHERE scope = $1 AND partition = $2`, m.Scope, p); err != nil {
		return err
	}
	_, err := to.Exec(ctx, `INSERT INTO jetinbox_partitions (scope, partition, owned) VALUES ($1, $2, true)
ON CONFLICT (scope, partition) DO UPDATE SET owned = true`, m.Scope, p)
	return err
}

// shardsFlag reports whether args[i] is -shards (with its value in it or
// next), and the value.
func shardsFlag(args []string, i int) (string, bool) {
	a := strings.TrimPrefix(strings.TrimPrefix(args[i], "-"), "-")
	if v, ok := strings.CutPrefix(a, "shards="); ok {
		return v, true
	}
	if a != "shards" {
		return "", false
	}
	if i+1 < len(args) {
		return args[i+1], true
	}
	return "", true
}

// raceMoves moves partition p from the first shard to the last and to the
// second at once, then runs the move again to the one that lost. With the
// shipped check exactly one succeeds and the rerun is refused; it returns
// the shard that took p.
func (r *shardRun) raceMoves(ctx context.Context, p int, mo shard.MoveOptions) (int, shard.MoveResult, error) {
	targets := []int{len(r.pools) - 1, 1}
	type result struct {
		res shard.MoveResult
		err error
	}
	results := make([]result, len(targets))
	var wg sync.WaitGroup
	for k, t := range targets {
		wg.Go(func() {
			res, err := shard.MoveWith(ctx, r.m, p, r.side(0), r.side(t), mo)
			results[k] = result{res, err}
		})
	}
	wg.Wait()
	r.fault("raced moves", len(targets)+1)
	winner := -1
	var won shard.MoveResult
	for k, x := range results {
		switch {
		case x.err == nil:
			if winner < 0 {
				winner, won = targets[k], x.res
			}
		case errors.Is(x.err, shard.ErrOtherTarget), errors.Is(x.err, shard.ErrHandOffRunning):
			r.refused++
		default:
			return 0, won, x.err
		}
	}
	if winner < 0 {
		return 0, won, errors.New("both raced moves were refused")
	}
	// The rerun to the other target, as partitions list's advice to run a
	// stopped move again might be misread.
	other := targets[0]
	if other == winner {
		other = targets[1]
	}
	_, err := shard.MoveWith(ctx, r.m, p, r.side(0), r.side(other), mo)
	switch {
	case errors.Is(err, shard.ErrOtherTarget), errors.Is(err, shard.ErrHandOffRunning):
		r.refused++
	case err != nil:
		return 0, won, fmt.Errorf("the rerun to s%d: %w", other, err)
	}
	return winner, won, nil
}

// replayCounts is what the replay during the move did in the source.
type replayCounts struct{ applied, notOwned atomic.Int64 }

// replayDuringMove replays the source shard's partition p with -apply,
// following the stream until ctx ends: through the shard's fenced
// processor, or, unsafe, the plain ledger processor with the owned set
// read at start. It closes started once it reads.
func (r *shardRun) replayDuringMove(ctx context.Context, p int, started chan<- struct{}, c *replayCounts) error {
	begin := sync.OnceFunc(func() { close(started) })
	defer begin()
	pool := r.pools[0]
	led, err := effects.NewScopedLedger(r.m.Scope)
	if err != nil {
		return err
	}
	var h inbox.Handler[pgx.Tx] = &shard.Fenced{Map: r.m, Inner: led}
	if r.o.unsafeReplay {
		h = led
	}
	inner, err := inbox.NewProcessor(pginbox.New(pool), h, inbox.Config{Scope: r.m.Scope, Logger: r.log})
	if err != nil {
		return err
	}
	proc := shard.NewProcessor(inner, r.m)
	owned, err := shard.Owned(ctx, pool, r.m.Scope)
	if err != nil {
		return err
	}
	proc.SetOwned(owned)
	s, err := r.js.Stream(ctx, r.m.Stream)
	if err != nil {
		return err
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{r.m.Filter(p)}})
	if err != nil {
		return err
	}
	it, err := oc.Messages(jetstream.PullMaxMessages(20))
	if err != nil {
		return err
	}
	defer it.Stop()
	go func() { <-ctx.Done(); it.Stop() }()
	begin()
	r.fault("replays during the move", 1)
	for ctx.Err() == nil {
		var msgs []inbox.Message
		for len(msgs) < 20 {
			nctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			m, err := it.Next(jetstream.NextContext(nctx))
			cancel()
			if err != nil {
				break
			}
			im := jsinbox.InboxMessage(m)
			im.Deliveries = 2
			msgs = append(msgs, im)
		}
		if len(msgs) == 0 {
			continue
		}
		out, err := proc.Process(ctx, msgs)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			continue // the kill: the next batch again
		}
		for _, o := range out {
			switch {
			case o.Status == inbox.StatusApplied:
				c.applied.Add(1)
			case errors.Is(o.Err, shard.ErrNotOwned):
				c.notOwned.Add(1)
			}
		}
	}
	return nil
}
