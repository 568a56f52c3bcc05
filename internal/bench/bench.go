// Package bench measures jetinbox's consumer side by side with the raw pipe
// (JetStream fetch + ack, no database) and the naive approach (one
// transaction per message), in one process and one run, on the same
// messages. Figures are ratios within the run: the machines are shared.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/deliverchaos"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// Options of one bench run.
type Options struct {
	N        int
	NaiveMax int
	Accounts int
	Hot      bool
	// HotToo also runs jetinbox, in the same rounds, on a second stream
	// whose messages are all on one hot account (when Hot is off).
	HotToo     bool
	Batch      int
	InFlight   int
	Consumers  int
	Rounds     int
	PayloadPad int
	SyncAlways bool
	PubBatch   int
	Callers    int
	Latency    time.Duration
	Rate       int
	// LoadLatency adds a latency phase at half the measured jetinbox
	// maximum to the low-load one.
	LoadLatency bool
	Only        string
	CPUProfile  string
	MemProfile  string
	ChildRSS    bool

	// followUps: the ledger emits a follow-up per credit into the outbox
	// (the outbox approach and its latency phase).
	followUps  bool
	followKind string
	// Store is where the inbox and the ledger live: postgres or sqlite.
	Store string
}

// Main is `jetinbox bench`.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// -cluster switches to the three-node run, which has flags of its own
	// (cluster.go).
	for i, a := range args {
		if a == "-http" || a == "--http" {
			return HTTPMain(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
		if a == "-cluster" || a == "--cluster" {
			return ClusterMain(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
		if a == "-deliver" || a == "--deliver" {
			return deliverchaos.BenchMain(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
		if a == "-relay" || a == "--relay" {
			return RelayMain(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
		// -shards 1,2,4 switches to the sharded run (shards.go).
		if name, v, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "="); strings.HasPrefix(a, "-") && name == "shards" {
			rest := slices.Delete(slices.Clone(args), i, i+1)
			if !hasValue {
				if i+1 >= len(args) {
					return cli.UsageError{Err: errors.New("bench -shards: want shard counts, e.g. -shards 1,2,4")}
				}
				v, rest = args[i+1], slices.Delete(rest, i, i+1)
			}
			return ShardsMain(ctx, v, rest, stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("jetinbox bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o Options
	fs.IntVar(&o.N, "n", 100_000, "messages per approach")
	fs.IntVar(&o.NaiveMax, "naive-max", 5_000, "messages for the naive approach (it runs at ~1k msg/s; its rate is what counts)")
	fs.IntVar(&o.Accounts, "accounts", 1024, "accounts the effect spreads over")
	fs.BoolVar(&o.Hot, "hot", false, "every message on one hot account")
	fs.BoolVar(&o.HotToo, "hot-too", true, "also run jetinbox in the same rounds on as many messages all on one hot account (a second stream), beside the spread ones")
	fs.IntVar(&o.Batch, "batch", 6000, "jetinbox: most messages per transaction")
	fs.IntVar(&o.InFlight, "inflight", 2, "jetinbox: batches in flight")
	fs.IntVar(&o.Consumers, "consumers", 1, "jetinbox: consumers on the durable, each with its own processor and connections")
	fs.IntVar(&o.Rounds, "rounds", 5, "rounds; rates and ratios are the median over rounds, ratios paired round by round")
	fs.IntVar(&o.PayloadPad, "payload-pad", 0, "extra payload bytes per message")
	fs.IntVar(&o.PubBatch, "publish-batch", 0, "producer: intents per JetStream atomic batch (0: one publish per intent)")
	fs.IntVar(&o.Callers, "callers", 64, "producer: also measure this many callers publishing one intent at a time, group commit vs one by one, on a node with sync_interval always (0 skips it)")
	fs.BoolVar(&o.SyncAlways, "sync-always", false, "JetStream fsyncs every write (production setting; the producer rate drops)")
	fs.DurationVar(&o.Latency, "latency", 5*time.Second, "length of each latency phase (0 skips them)")
	fs.IntVar(&o.Rate, "rate", 1000, "offered msg/s in the low-load latency phase")
	fs.BoolVar(&o.LoadLatency, "load-latency", true, "also measure latency at half the measured jetinbox maximum")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a Go CPU profile of the consuming phases (NATS server included) to this file")
	fs.StringVar(&o.MemProfile, "memprofile", "", "write a Go allocation profile of the consuming phases (NATS server included) to this file, and the allocations before them to <file>.base (go tool pprof -diff_base <file>.base <file>)")
	fs.BoolVar(&o.ChildRSS, "child", true, "also run the consumer as its own process over the same messages and report its peak RSS (memory is bounded by batch × in-flight, not by the stream)")
	fs.StringVar(&o.Only, "only", "", "run only these approaches, comma separated: raw,naive,jetinbox,jetinbox-hot (jetinbox on the hot stream, see -hot-too),outbox (jetinbox whose ledger emits a follow-up per credit through the outbox, then the relay draining it)")
	fs.StringVar(&o.Store, "store", cli.StorePostgres, "the inbox store: postgres (a throwaway server, fsync on), pgbouncer (the same server behind a pgbouncer in transaction mode) or sqlite (files in a temporary directory, WAL, synchronous=FULL)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox bench: raw pipe vs naive vs jetinbox on the same messages, embedded NATS and a throwaway PostgreSQL (fsync on) or SQLite files (-store sqlite).\n"+
			"-cluster (three nodes), -shards 1,2,4 (a partitioned stream, a PostgreSQL per shard) and -relay (the outbox relay's publish modes) have flags of their own: jetinbox bench -shards 1 -h.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := o.validate(fs.NArg()); err != nil {
		return cli.UsageError{Err: fmt.Errorf("bench: %w", err)}
	}
	return Run(ctx, o, stdout, stderr)
}

// validate reports every flag out of its range at once.
func (o Options) validate(extra int) error {
	var errs []error
	for _, f := range []struct {
		name   string
		v, min int
	}{
		{"n", o.N, 1}, {"naive-max", o.NaiveMax, 1}, {"accounts", o.Accounts, 1}, {"batch", o.Batch, 1},
		{"inflight", o.InFlight, 1}, {"consumers", o.Consumers, 1}, {"rounds", o.Rounds, 1},
		{"payload-pad", o.PayloadPad, 0}, {"publish-batch", o.PubBatch, 0}, {"rate", o.Rate, 1}, {"callers", o.Callers, 0},
	} {
		if f.v < f.min {
			errs = append(errs, fmt.Errorf("-%s %d: must be at least %d", f.name, f.v, f.min))
		}
	}
	if o.Latency < 0 {
		errs = append(errs, fmt.Errorf("-latency %v: must not be negative", o.Latency))
	}
	for _, a := range strings.Split(o.Only, ",") {
		if a != "" && !slices.Contains([]string{"raw", "naive", "jetinbox", "jetinbox-hot", "outbox"}, a) {
			errs = append(errs, fmt.Errorf("-only %q: want raw, naive, jetinbox, jetinbox-hot or outbox", a))
		}
	}
	if o.Store != cli.StorePostgres && o.Store != cli.StoreSQLite && o.Store != storePgBouncer {
		errs = append(errs, fmt.Errorf("-store %q: want postgres, pgbouncer or sqlite", o.Store))
	}
	if extra > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments"))
	}
	return errors.Join(errs...)
}

type result struct {
	name  string
	n     int
	rates []float64
	lat   []time.Duration // publish-to-commit, latency phase
}

func (r *result) rate() float64 { return median(r.rates) }

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// ratio is the median of per-round ratios with their range.
type ratio struct{ med, lo, hi float64 }

// ratios pairs a's and b's rates round by round (the approaches ran one
// after another within a round, on the same machine state) and summarises
// a/b: a median of each approach's rates could pair a fast round of one
// with a slow round of the other.
func ratios(a, b []float64) ratio {
	n := min(len(a), len(b))
	r := make([]float64, n)
	for i := range n {
		r[i] = a[i] / b[i]
	}
	return ratio{med: median(r), lo: slices.Min(r), hi: slices.Max(r)}
}

func (r ratio) String() string {
	if r.lo == r.hi {
		return fmt.Sprintf("%.2fx", r.med)
	}
	return fmt.Sprintf("%.2fx (%.2f–%.2f)", r.med, r.lo, r.hi)
}

// Run runs the benchmark.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	say := func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
	srv, err := natsenv.StartNATS(natsenv.NATSOptions{SyncAlways: o.SyncAlways})
	if err != nil {
		return err
	}
	defer srv.Close()
	if o.Store == "" {
		o.Store = cli.StorePostgres
	}
	dbs, err := openDatabases(ctx, o.Store)
	if err != nil {
		return err
	}
	defer dbs.close()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream := jsinbox.StreamConfig{}.WithDefaults()
	if _, err := jsinbox.EnsureStream(ctx, js, stream); err != nil {
		return err
	}
	// Where the outbox approach's follow-ups go.
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{Name: followStream, Subjects: []string{followSubject + ".>"}}); err != nil {
		return err
	}

	// Publish the messages once; every approach reads the same ones.
	intents := pipeline.Generate(pipeline.Load{Count: o.N, Accounts: o.Accounts, HotAccount: o.Hot, Prefix: "b", Seed: 7, PayloadPad: o.PayloadPad})
	t0 := time.Now()
	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{MaxInFlight: 8192, Batch: max(o.PubBatch, 1)}) // 0 and 1: one publish per intent
	if err != nil {
		return err
	}
	defer pub.Close()
	for _, in := range intents {
		if err := pub.PublishAsync(ctx, in); err != nil {
			return err
		}
	}
	if err := pub.Flush(ctx); err != nil {
		return err
	}
	pubRate := float64(o.N) / time.Since(t0).Seconds()
	// Keep only what the ledger check needs, so that the memory figures
	// below are the consumers', not the generated load's.
	payloadSize := len(intents[0].Payload)
	prefixSums, err := sumsOf(intents)
	if err != nil {
		return err
	}
	intents = nil
	// The hot case in the same run: as many messages, all on account 1,
	// in a stream of their own (published after the clock above stopped).
	var hotSums []int64
	hotToo := o.HotToo && !o.Hot
	if hotToo {
		// Small limits: the server reserves what a stream may hold, and
		// the defaults of three more streams may not fit the disk.
		hs := jsinbox.StreamConfig{Name: hotStream, Subjects: []string{hotSubject + ".>"}, MaxBytes: 1 << 30, DeadLetterMaxBytes: 64 << 20}
		adv := hs.AdvisoryConfig()
		adv.MaxBytes = 64 << 20
		if _, err := js.CreateOrUpdateStream(ctx, adv); err != nil {
			return err
		}
		if _, err := jsinbox.EnsureStream(ctx, js, hs); err != nil {
			return err
		}
		hot := pipeline.Generate(pipeline.Load{Count: o.N, Accounts: o.Accounts, HotAccount: true, Prefix: "h", Subject: hotSubject, Seed: 7, PayloadPad: o.PayloadPad})
		hotPub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{Stream: hotStream, MaxInFlight: 8192, Batch: max(o.PubBatch, 1)})
		if err != nil {
			return err
		}
		for _, in := range hot {
			if err := hotPub.PublishAsync(ctx, in); err != nil {
				hotPub.Close()
				return err
			}
		}
		err = hotPub.Flush(ctx)
		failed := hotPub.Stats().Failed
		hotPub.Close()
		if err != nil {
			return err
		}
		if failed > 0 {
			return fmt.Errorf("bench: %d publishes to %s failed", failed, hotStream)
		}
		if hotSums, err = sumsOf(hot); err != nil {
			return err
		}
	}
	runtime.GC()
	if s := pub.Stats(); s.Failed > 0 {
		return fmt.Errorf("bench: %d publishes failed", s.Failed)
	}
	ps := pub.Stats()
	say("published %d messages at %.0f msg/s (sync_interval always: %v, %s: %d batches stored, %d refused and published one by one)",
		o.N, pubRate, o.SyncAlways, pubMode(o.PubBatch), ps.Batches, ps.BatchFallbacks)
	var callers *callersResult
	if o.Callers > 0 {
		if callers, err = callersPhase(ctx, o, say); err != nil {
			return err
		}
	}

	if o.CPUProfile != "" {
		// Profile the consumers, not the publishing above.
		f, err := os.Create(o.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if o.MemProfile != "" {
		// The allocation profile counts from the start of the process:
		// the one taken now, before the consumers, goes next to it as
		// <file>.base for go tool pprof -diff_base.
		stopMem, err := memProfile(o.MemProfile)
		if err != nil {
			return err
		}
		defer func() {
			if err := stopMem(); err != nil {
				say("memprofile: %v", err)
			}
		}()
	}
	want := func(name string) bool {
		if name == "outbox" && o.Store == cli.StoreSQLite {
			return false // the ledger's follow-ups go to the outbox in PostgreSQL
		}
		if name == "jetinbox-hot" && !hotToo {
			return false
		}
		return o.Only == "" || slices.Contains(strings.Split(o.Only, ","), name)
	}
	results := map[string]*result{}
	var relays []relayRun
	var heapPeak atomic.Uint64
	stopSampler := sampleHeap(&heapPeak)
	defer stopSampler()
	for round := 1; round <= o.Rounds; round++ {
		for _, a := range []struct {
			name   string
			stream string  // default: the intents stream
			sums   []int64 // default: prefixSums
			n      int
			run    func(context.Context, jetstream.Consumer, *cli.Store, int) error
			// timed, if set, runs instead of run and says how long the
			// part that counts took.
			timed func(context.Context, jetstream.Consumer, *cli.Store, int) (time.Duration, error)
		}{
			{"raw", "", nil, o.N, runRaw, nil},
			{"naive", "", nil, min(o.N, o.NaiveMax), runNaive, nil},
			{"jetinbox", "", nil, o.N, func(ctx context.Context, c jetstream.Consumer, pool *cli.Store, n int) error {
				return runJetinbox(ctx, js, c, pool, n, o)
			}, nil},
			{"jetinbox-hot", hotStream, hotSums, o.N, func(ctx context.Context, c jetstream.Consumer, pool *cli.Store, n int) error {
				return runJetinbox(ctx, js, c, pool, n, o)
			}, nil},
			{"outbox", "", nil, o.N, nil, func(ctx context.Context, c jetstream.Consumer, pool *cli.Store, n int) (time.Duration, error) {
				return runOutbox(ctx, js, c, pool, n, o, &relays)
			}},
		} {
			if !want(a.name) {
				continue
			}
			durable := fmt.Sprintf("%s_%d", strings.ReplaceAll(a.name, "-", "_"), round)
			streamName, sums := stream.Name, prefixSums
			if a.stream != "" {
				streamName, sums = a.stream, a.sums
			}
			pool, err := dbs.create(ctx, durable, o.Accounts)
			if err != nil {
				return err
			}
			cons, err := js.CreateOrUpdateConsumer(ctx, streamName, jetstream.ConsumerConfig{
				Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 50_000, AckWait: time.Minute, MaxDeliver: 20,
			})
			if err != nil {
				pool.Close()
				return err
			}
			start := time.Now()
			var el time.Duration
			if a.timed != nil {
				el, err = a.timed(ctx, cons, pool, a.n)
			} else {
				err = a.run(ctx, cons, pool, a.n)
				el = time.Since(start)
			}
			if err == nil && a.name != "raw" {
				err = checkLedger(ctx, pool, a.n, sums[a.n])
			}
			var deadlocks int64
			if pool.PG != nil {
				_ = pool.PG.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks)
			}
			if deadlocks > 0 {
				say("  %s: %d deadlocks (each costs deadlock_timeout)", a.name, deadlocks)
			}
			pool.Close()
			if err != nil {
				return fmt.Errorf("bench %s: %w", a.name, err)
			}
			// Verified: drop its database and its durable, so that neither
			// cleaning up the one (autovacuum) nor tracking the other
			// (the naive round leaves messages pending) runs during the
			// next phases.
			if err := dbs.drop(ctx, durable); err != nil {
				return err
			}
			if err := js.DeleteConsumer(ctx, streamName, durable); err != nil {
				return err
			}
			r := results[a.name]
			if r == nil {
				r = &result{name: a.name, n: a.n}
				results[a.name] = r
			}
			r.rates = append(r.rates, float64(a.n)/el.Seconds())
			say("round %d %-12s %7d msgs in %6.2fs = %8.0f msg/s", round, a.name, a.n, el.Seconds(), float64(a.n)/el.Seconds())
		}
	}

	var child *childResult
	if o.ChildRSS && want("jetinbox") {
		child, err = childConsumer(ctx, srv.URL(), dbs, o, prefixSums[o.N])
		if err != nil {
			return err
		}
	}

	var startup []time.Duration
	if want("jetinbox") {
		if startup, err = startupPhase(ctx, js, dbs, o); err != nil {
			return err
		}
		say("start-up: time to first commit %v", startup)
	}

	var lats []*latencyRun
	if o.Latency > 0 && want("jetinbox") {
		// Latency at a low rate and at half the measured jetinbox maximum,
		// each measured on its own, not alongside PostgreSQL cleaning up
		// after the phase before.
		rates := []int{o.Rate}
		if j := results["jetinbox"]; j != nil && o.LoadLatency {
			rates = append(rates, max(o.Rate, int(j.rate()/2)))
		}
		for i, rate := range rates {
			if err := dbs.settle(ctx); err != nil {
				return err
			}
			run, err := latencyPhase(ctx, js, dbs, o, rate, fmt.Sprintf("latency_%d", i))
			if err != nil {
				return err
			}
			say("latency phase at %d msg/s offered (%.0f achieved): p50 %v p99 %v", rate, run.achieved, pct(run.lat, 50), pct(run.lat, 99))
			lats = append(lats, run)
		}
	}
	var outboxLat *latencyRun
	if o.Latency > 0 && want("outbox") {
		if err := dbs.settle(ctx); err != nil {
			return err
		}
		lo := o
		lo.followUps = true
		if outboxLat, err = latencyPhase(ctx, js, dbs, lo, o.Rate, "latency_outbox"); err != nil {
			return err
		}
		say("outbox latency phase at %d msg/s offered: emit-to-publish p50 %v p99 %v", o.Rate, pct(outboxLat.relayLat, 50), pct(outboxLat.relayLat, 99))
	}

	fmt.Fprintf(stdout, "\njetinbox bench: %d messages, %d accounts%s, %d consumer(s), batch ≤ %d, %d in flight, payload %d B, %d round(s), median\n",
		o.N, o.Accounts, map[bool]string{true: " (hot: all on account 1)"}[o.Hot], o.Consumers, o.Batch, o.InFlight, payloadSize, o.Rounds)
	fmt.Fprintf(stdout, "store: %s\n", dbs)
	if callers != nil {
		callers.write(stdout)
	}
	fmt.Fprintf(stdout, "producer: %.0f msg/s into a local stream (sync_interval always: %v, %s)\n\n", pubRate, o.SyncAlways, pubMode(o.PubBatch))
	fmt.Fprintf(stdout, "%-38s %10s  %s\n", "approach", "msg/s", "vs raw (median of per-round ratios, min–max)")
	raw := results["raw"]
	for _, name := range []string{"raw", "naive", "jetinbox", "jetinbox-hot", "outbox"} {
		r := results[name]
		if r == nil {
			continue
		}
		label := map[string]string{
			"raw":          "raw fetch+ack, no database",
			"naive":        fmt.Sprintf("naive: 1 tx per message (%d msgs)", r.n),
			"jetinbox":     "jetinbox consumer",
			"jetinbox-hot": "jetinbox consumer, one hot account",
			"outbox":       "jetinbox + a follow-up per credit",
		}[name]
		vs := "-"
		if raw != nil {
			vs = ratios(r.rates, raw.rates).String()
		}
		fmt.Fprintf(stdout, "%-38s %10.0f  %s\n", label, r.rate(), vs)
	}
	if j, n := results["jetinbox"], results["naive"]; j != nil && n != nil {
		fmt.Fprintf(stdout, "\njetinbox / naive: %s\n", ratios(j.rates, n.rates))
	}
	if ob, j := results["outbox"], results["jetinbox"]; ob != nil && j != nil {
		fmt.Fprintf(stdout, "jetinbox + follow-ups / jetinbox: %s (the outbox row each credit adds, in the same transaction)\n", ratios(ob.rates, j.rates))
	}
	if len(relays) > 0 {
		rates := make([]float64, len(relays))
		for i, r := range relays {
			rates[i] = r.rate
		}
		fmt.Fprintf(stdout, "outbox relay draining %d rows into a stream: %.0f rows/s (median of %d rounds; publish, PubAck, mark sent)\n", o.N, median(rates), len(rates))
	}
	for i, l := range lats {
		load := "low load"
		if i > 0 {
			load = "50% of the jetinbox maximum"
		}
		fmt.Fprintf(stdout, "publish-to-commit at %d msg/s offered (%s, %.0f achieved): p50 %v  p99 %v  max %v  (%d messages)\n",
			l.offered, load, l.achieved, pct(l.lat, 50), pct(l.lat, 99), pct(l.lat, 100), len(l.lat))
		writeStages(stdout, "  ", l.stages)
		if l.runtime.cycles > 0 || l.runtime.max > 0 {
			fmt.Fprintf(stdout, "  %v\n", l.runtime)
		}
	}
	if l := outboxLat; l != nil {
		fmt.Fprintf(stdout, "emit-to-publish at %d msg/s offered (relay beside the consumer, %.0f achieved): p50 %v  p99 %v  max %v  (%d follow-ups)\n",
			l.offered, l.achieved, pct(l.relayLat, 50), pct(l.relayLat, 99), pct(l.relayLat, 100), len(l.relayLat))
	}
	if len(startup) > 0 {
		fmt.Fprintf(stdout, "time to first commit of a cold consumer (Run to commit, no open connection, a message waiting): median %v, max %v (%d starts)\n",
			pct(startup, 50), pct(startup, 100), len(startup))
	}
	if child != nil {
		fmt.Fprintf(stdout, "consumer as its own process (jetinbox consumer, batch ≤ %d, %d in flight): %.0f msg/s, peak RSS %s (%s after the first %d messages)\n",
			o.Batch, o.InFlight, child.rate, child.peakRSS, child.earlyRSS, o.N/4)
	}
	fmt.Fprintf(stdout, "peak Go heap %s; peak RSS of the process (NATS server, consumers, bench) %s\n",
		mib(heapPeak.Load()), peakRSS())
	fmt.Fprintln(stdout, "ledger verified: every ID exactly once, balances exact")
	return nil
}

// memProfile writes the allocation profile as it stands now to path+".base"
// and returns a function that writes it, as it stands then, to path.
func memProfile(path string) (func() error, error) {
	write := func(path string) error {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := write(path + ".base"); err != nil {
		return nil, err
	}
	return func() error { return write(path) }, nil
}

// The stream of the hot case (see Options.HotToo).
const (
	hotStream  = "HOT_INTENTS"
	hotSubject = "hot"
)

// sumsOf returns the prefix sums of the intents' amounts: sums[n] is what
// the first n credit in all.
func sumsOf(intents []inbox.Intent) ([]int64, error) {
	sums := make([]int64, len(intents)+1)
	for i, in := range intents {
		p, err := effects.ParseIntent(in.Payload)
		if err != nil {
			return nil, err
		}
		sums[i+1] = sums[i] + p.Amount
	}
	return sums, nil
}

func pubMode(batch int) string {
	if batch > 1 {
		return fmt.Sprintf("atomic batches of %d", batch)
	}
	return "one publish per intent"
}
