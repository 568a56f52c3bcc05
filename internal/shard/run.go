package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// Runner runs one shard: a jsinbox consumer on the durable of every
// partition its database says it owns, all on one processor and one pool.
// It reads the partition table every Poll and starts or stops partitions
// as moves change it, without touching the others.
//
// With [Map.ShardDurables] it runs the shard's one durable instead,
// filtered on the partitions it owns, and the hand-off durables of the
// partitions moved to it until its durable covers them.
type Runner struct {
	JS   jetstream.JetStream
	Pool *pgxpool.Pool
	Map  *Map
	// Name is the shard's name in the map: its durable's, with
	// [Map.ShardDurables].
	Name string
	// Proc is the shard's processor: [NewProcessor] over the inbox
	// processor whose effect is wrapped in [Fenced].
	Proc *Processor
	// Batch, if set, is what the partition consumers process with in
	// place of Proc (tests swap in a broken one); Proc still holds the
	// owned set.
	Batch jsinbox.BatchProcessor
	// Consumer is the settings every partition's consumer gets; Stream,
	// Durable and FilterSubjects are set per partition.
	Consumer jsinbox.ConsumerConfig
	// MaxBytes, if set, is the shard's memory budget for messages: a
	// partition consumer starting gets MaxBytes over the number of
	// partitions the database says the shard owns then (at least 1 MiB),
	// in place of Consumer.MaxBytes. A partition moved in later gets its
	// share of the new count; those running keep theirs until restarted.
	// With [Map.ShardDurables], the shard's durable gets three quarters
	// and each hand-off an eighth.
	MaxBytes int64
	// Poll is how often the partition table is read. Default 1s.
	Poll time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// OnConsumer, if set, sees every partition consumer before it runs
	// (tests arm crash points on it).
	OnConsumer func(partition int, c *jsinbox.Consumer)
	// PartitionBatches, if set, has every partition consumer form its own
	// batches, each of its partition's messages only, as before one
	// batcher per shard. Default: one [jsinbox.Batcher] forms the
	// shard's batches from all its partition durables (Consumer.BatchSize
	// and Consumer.InFlight are then the shard's, not each partition's),
	// so its transactions are as large as one durable's.
	PartitionBatches bool

	batcher *jsinbox.Batcher

	mu      sync.Mutex
	running map[int]*partitionRun
	// With ShardDurables: the shard durable's consumer and the partitions
	// it reads, and the hand-offs being read, by partition.
	main       *partitionRun
	mainFilter Set
	handOffs   map[int]*partitionRun
}

type partitionRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	c      *jsinbox.Consumer
	// stopBatcher, if set, stops the run's own batcher once its consumer
	// returned (a hand-off's).
	stopBatcher func()
}

// stop ends the run and waits for it.
func (pr *partitionRun) stop() {
	pr.cancel()
	pr.wait()
}

// wait waits for a cancelled run, then stops its own batcher.
func (pr *partitionRun) wait() {
	<-pr.done
	if pr.stopBatcher != nil {
		pr.stopBatcher()
	}
}

// Running returns the partitions whose consumers run now.
func (r *Runner) Running() Set {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Map.ShardDurables {
		var s Set
		if r.main != nil {
			s = slices.DeleteFunc(slices.Clone(r.mainFilter), func(p int) bool { return !r.Proc.Owns(p) })
		}
		return s
	}
	var s Set
	for p := range r.running {
		s = append(s, p)
	}
	slices.Sort(s)
	return s
}

// Ready reports whether every running partition consumer pulls.
func (r *Runner) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pr := range r.runs() {
		pr.mu.Lock()
		c := pr.c
		pr.mu.Unlock()
		if c == nil || !c.Ready() {
			return false
		}
	}
	return true
}

// Run consumes the shard's partitions until ctx ends, then stops every
// partition consumer (each drains its batches in flight) and returns nil.
// It fails only if the partition table cannot be read at start.
func (r *Runner) Run(ctx context.Context) error {
	if r.Poll <= 0 {
		r.Poll = time.Second
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	r.mu.Lock() // /readyz may ask Ready or Running already
	r.running = map[int]*partitionRun{}
	r.handOffs = map[int]*partitionRun{}
	r.mu.Unlock()
	if r.Map.ShardDurables && r.Name == "" {
		return errors.New("shard: a map with shard_durables needs the runner's shard name")
	}
	owned, err := Owned(ctx, r.Pool, r.Map.Scope)
	if err != nil {
		return fmt.Errorf("%w (run jetinbox migrate -shards FILE -shard NAME first)", err)
	}
	var st shardState
	if r.Map.ShardDurables {
		if st, err = r.readState(ctx); err != nil {
			return fmt.Errorf("%w (run jetinbox migrate -shards FILE -shard NAME first)", err)
		}
	}
	if !r.PartitionBatches {
		// Stopped after every partition consumer: a consumer returns only
		// once the batcher settled or handed back all it gave it.
		r.batcher = jsinbox.NewBatcher(r.Consumer.BatchSize, r.Consumer.InFlight)
		bctx, stopBatcher := context.WithCancel(context.WithoutCancel(ctx))
		batcherDone := make(chan struct{})
		go func() {
			defer close(batcherDone)
			r.batcher.Run(bctx)
		}()
		defer func() {
			stopBatcher()
			<-batcherDone
		}()
	}
	defer r.stopAll()
	tick := time.NewTicker(r.Poll)
	defer tick.Stop()
	for {
		if r.Map.ShardDurables {
			r.applyShard(ctx, st)
		} else {
			r.apply(ctx, owned)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if r.Map.ShardDurables {
			if s, err := r.readState(ctx); err == nil {
				st = s
			} else if ctx.Err() == nil {
				r.Logger.Warn("shard: reading the partition table failed; keeping the partitions running", "err", err)
			}
			continue
		}
		if o, err := Owned(ctx, r.Pool, r.Map.Scope); err == nil {
			owned = o
		} else if ctx.Err() == nil {
			// The fence in each transaction still holds; keep what runs.
			r.Logger.Warn("shard: reading the partition table failed; keeping the partitions running", "err", err)
		}
	}
}

// apply starts the partitions newly owned and stops those given away.
func (r *Runner) apply(ctx context.Context, owned Set) {
	r.mu.Lock()
	var stop []*partitionRun
	var stopped Set
	for p, pr := range r.running {
		if !slices.Contains(owned, p) {
			stop = append(stop, pr)
			stopped = append(stopped, p)
			delete(r.running, p)
		}
	}
	// The processor refuses a partition before its consumer stops, and
	// takes one before its consumer starts.
	r.Proc.SetOwned(owned)
	var started Set
	for _, p := range owned {
		if _, ok := r.running[p]; ok || p >= r.Map.Partitions {
			continue
		}
		r.running[p] = r.start(ctx, p, len(owned))
		started = append(started, p)
	}
	r.mu.Unlock()
	if len(started) > 0 {
		slices.Sort(started)
		r.Logger.Info("shard: partitions started", "partitions", started.String())
	}
	if len(stop) > 0 {
		slices.Sort(stopped)
		r.Logger.Info("shard: partitions given away; stopping their consumers", "partitions", stopped.String())
		for _, pr := range stop {
			pr.cancel()
		}
		for _, pr := range stop {
			<-pr.done
		}
	}
}

// start runs partition p's consumer, restarting it after a crash; the
// shard owns owned partitions now.
func (r *Runner) start(ctx context.Context, p, owned int) *partitionRun {
	cfg := r.Consumer
	if r.MaxBytes > 0 {
		cfg.MaxBytes = max(r.MaxBytes/int64(max(1, owned)), 1<<20)
	}
	cfg.Stream, cfg.Durable, cfg.FilterSubjects = r.Map.Stream, r.Map.Durable(p), []string{r.Map.Filter(p)}
	cfg.Batcher = r.batcher
	return r.startConsumer(ctx, p, cfg, r.Proc)
}

// startConsumer runs a consumer with cfg, restarting it after a crash,
// until the run is cancelled; p is its partition for the logs (-1: the
// shard's durable).
func (r *Runner) startConsumer(ctx context.Context, p int, cfg jsinbox.ConsumerConfig, proc jsinbox.BatchProcessor) *partitionRun {
	pctx, cancel := context.WithCancel(ctx)
	pr := &partitionRun{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(pr.done)
		wait := 100 * time.Millisecond // grows while the consumer keeps failing
		for pctx.Err() == nil {
			began := time.Now()
			bp := proc
			if r.Batch != nil {
				bp = r.Batch
			}
			c, err := jsinbox.NewConsumer(r.JS, bp, cfg)
			if err == nil {
				pr.mu.Lock()
				pr.c = c
				pr.mu.Unlock()
				if r.OnConsumer != nil {
					r.OnConsumer(p, c)
				}
				err = c.Run(pctx)
			}
			if pctx.Err() != nil {
				return
			}
			var setup *jsinbox.SetupError
			if errors.As(err, &setup) {
				r.Logger.Error("shard: partition consumer cannot start", "partition", p, "durable", cfg.Durable, "err", err)
			} else if err != nil {
				r.Logger.Warn("shard: partition consumer stopped; restarting", "partition", p, "err", err)
			}
			if time.Since(began) > time.Minute {
				wait = 100 * time.Millisecond
			}
			select {
			case <-pctx.Done():
			case <-time.After(wait + rand.N(wait)):
			}
			wait = min(2*wait, 10*time.Second)
		}
	}()
	return pr
}

// runs returns every consumer run: the partitions', or the shard
// durable's and the hand-offs'. r.mu is held.
func (r *Runner) runs() []*partitionRun {
	all := make([]*partitionRun, 0, len(r.running)+len(r.handOffs)+1)
	for _, pr := range r.running {
		all = append(all, pr)
	}
	if r.main != nil {
		all = append(all, r.main)
	}
	for _, pr := range r.handOffs {
		all = append(all, pr)
	}
	return all
}

func (r *Runner) stopAll() {
	r.mu.Lock()
	all := r.runs()
	r.running, r.handOffs, r.main, r.mainFilter = map[int]*partitionRun{}, map[int]*partitionRun{}, nil, nil
	r.mu.Unlock()
	for _, pr := range all {
		pr.cancel()
	}
	for _, pr := range all {
		pr.wait()
	}
}
