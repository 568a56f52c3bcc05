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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/effects"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// Options of one bench run.
type Options struct {
	N          int
	NaiveMax   int
	Accounts   int
	Hot        bool
	Batch      int
	InFlight   int
	Consumers  int
	Rounds     int
	PayloadPad int
	SyncAlways bool
	PubBatch   int
	Latency    time.Duration
	Rate       int
	Only       string
	CPUProfile string
	ChildRSS   bool
}

// Main is `jetinbox bench`.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// -cluster switches to the three-node run, which has flags of its own
	// (cluster.go).
	for i, a := range args {
		if a == "-cluster" || a == "--cluster" {
			return ClusterMain(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("jetinbox bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o Options
	fs.IntVar(&o.N, "n", 100_000, "messages per approach")
	fs.IntVar(&o.NaiveMax, "naive-max", 5_000, "messages for the naive approach (it runs at ~1k msg/s; its rate is what counts)")
	fs.IntVar(&o.Accounts, "accounts", 1024, "accounts the effect spreads over")
	fs.BoolVar(&o.Hot, "hot", false, "every message on one hot account")
	fs.IntVar(&o.Batch, "batch", 6000, "jetinbox: most messages per transaction")
	fs.IntVar(&o.InFlight, "inflight", 2, "jetinbox: batches in flight")
	fs.IntVar(&o.Consumers, "consumers", 1, "jetinbox: consumers on the durable, each with its own processor and connections")
	fs.IntVar(&o.Rounds, "rounds", 1, "rounds; the median is reported")
	fs.IntVar(&o.PayloadPad, "payload-pad", 0, "extra payload bytes per message")
	fs.IntVar(&o.PubBatch, "publish-batch", 0, "producer: intents per JetStream atomic batch (0: one publish per intent)")
	fs.BoolVar(&o.SyncAlways, "sync-always", false, "JetStream fsyncs every write (production setting; the producer rate drops)")
	fs.DurationVar(&o.Latency, "latency", 5*time.Second, "length of the low-load latency phase (0 skips it)")
	fs.IntVar(&o.Rate, "rate", 1000, "offered msg/s in the latency phase")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a Go CPU profile of the consuming phases (NATS server included) to this file")
	fs.BoolVar(&o.ChildRSS, "child", true, "also run the consumer as its own process over the same messages and report its peak RSS (memory is bounded by batch × in-flight, not by the stream)")
	fs.StringVar(&o.Only, "only", "", "run only these approaches, comma separated: raw,naive,jetinbox")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox bench: raw pipe vs naive vs jetinbox on the same messages, embedded NATS and a throwaway PostgreSQL (fsync on).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.N < 1 || o.Batch < 1 || o.InFlight < 1 || o.Rounds < 1 || o.Consumers < 1 {
		return errors.New("bench: -n, -batch, -inflight, -consumers and -rounds must be positive")
	}
	return Run(ctx, o, stdout, stderr)
}

type result struct {
	name  string
	n     int
	rates []float64
	lat   []time.Duration // publish-to-commit, latency phase
}

func (r *result) rate() float64 {
	s := slices.Clone(r.rates)
	slices.Sort(s)
	return s[len(s)/2]
}

// Run runs the benchmark.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	say := func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
	srv, err := testenv.StartNATS(testenv.NATSOptions{SyncAlways: o.SyncAlways})
	if err != nil {
		return err
	}
	defer srv.Close()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Durable: true})
	if err != nil {
		return err
	}
	defer pg.Close()
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

	// Publish the messages once; every approach reads the same ones.
	intents := pipeline.Generate(pipeline.Load{Count: o.N, Accounts: o.Accounts, HotAccount: o.Hot, Prefix: "b", Seed: 7, PayloadPad: o.PayloadPad})
	t0 := time.Now()
	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{MaxInFlight: 8192, Batch: o.PubBatch})
	if err != nil {
		return err
	}
	defer pub.Close()
	for _, in := range intents {
		if err := pub.Publish(ctx, in); err != nil {
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
	prefixSums := make([]int64, len(intents)+1)
	for i, in := range intents {
		p, err := effects.ParseIntent(in.Payload)
		if err != nil {
			return err
		}
		prefixSums[i+1] = prefixSums[i] + p.Amount
	}
	intents = nil
	runtime.GC()
	if s := pub.Stats(); s.Failed > 0 {
		return fmt.Errorf("bench: %d publishes failed", s.Failed)
	}
	ps := pub.Stats()
	say("published %d messages at %.0f msg/s (sync_interval always: %v, %s: %d batches stored, %d refused and published one by one)",
		o.N, pubRate, o.SyncAlways, pubMode(o.PubBatch), ps.Batches, ps.BatchFallbacks)

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
	want := func(name string) bool { return o.Only == "" || slices.Contains(strings.Split(o.Only, ","), name) }
	results := map[string]*result{}
	var heapPeak atomic.Uint64
	stopSampler := sampleHeap(&heapPeak)
	defer stopSampler()
	for round := 1; round <= o.Rounds; round++ {
		for _, a := range []struct {
			name string
			n    int
			run  func(context.Context, jetstream.Consumer, *pgxpool.Pool, int) error
		}{
			{"raw", o.N, runRaw},
			{"naive", min(o.N, o.NaiveMax), runNaive},
			{"jetinbox", o.N, func(ctx context.Context, c jetstream.Consumer, pool *pgxpool.Pool, n int) error {
				return runJetinbox(ctx, js, c, pool, n, o)
			}},
		} {
			if !want(a.name) {
				continue
			}
			durable := fmt.Sprintf("%s_%d", a.name, round)
			pool, err := benchDB(ctx, pg, durable, o.Accounts)
			if err != nil {
				return err
			}
			cons, err := js.CreateOrUpdateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{
				Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 50_000, AckWait: time.Minute, MaxDeliver: 20,
			})
			if err != nil {
				pool.Close()
				return err
			}
			start := time.Now()
			err = a.run(ctx, cons, pool, a.n)
			el := time.Since(start)
			if err == nil && a.name != "raw" {
				err = checkLedger(ctx, pool, a.n, prefixSums[a.n])
			}
			var deadlocks int64
			_ = pool.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks)
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
			if err := pg.DropDatabase(ctx, durable); err != nil {
				return err
			}
			if err := js.DeleteConsumer(ctx, stream.Name, durable); err != nil {
				return err
			}
			r := results[a.name]
			if r == nil {
				r = &result{name: a.name, n: a.n}
				results[a.name] = r
			}
			r.rates = append(r.rates, float64(a.n)/el.Seconds())
			say("round %d %-9s %7d msgs in %6.2fs = %8.0f msg/s", round, a.name, a.n, el.Seconds(), float64(a.n)/el.Seconds())
		}
	}

	var child *childResult
	if o.ChildRSS && want("jetinbox") {
		child, err = childConsumer(ctx, srv.URL(), pg, o, prefixSums[o.N])
		if err != nil {
			return err
		}
	}

	var lat []time.Duration
	if o.Latency > 0 && want("jetinbox") {
		// Low load is measured on its own, not alongside PostgreSQL
		// cleaning up after the throughput phases.
		if err := pg.Settle(ctx, 30*time.Second); err != nil {
			return err
		}
		lat, err = latencyPhase(ctx, js, pg, o)
		if err != nil {
			return err
		}
	}

	fmt.Fprintf(stdout, "\njetinbox bench: %d messages, %d accounts%s, %d consumer(s), batch ≤ %d, %d in flight, payload %d B, %d round(s), median\n",
		o.N, o.Accounts, map[bool]string{true: " (hot: all on account 1)"}[o.Hot], o.Consumers, o.Batch, o.InFlight, payloadSize, o.Rounds)
	fmt.Fprintf(stdout, "producer: %.0f msg/s into a local stream (sync_interval always: %v, %s)\n\n", pubRate, o.SyncAlways, pubMode(o.PubBatch))
	fmt.Fprintf(stdout, "%-38s %10s %9s\n", "approach", "msg/s", "vs raw")
	raw := results["raw"]
	for _, name := range []string{"raw", "naive", "jetinbox"} {
		r := results[name]
		if r == nil {
			continue
		}
		label := map[string]string{
			"raw":      "raw fetch+ack, no database",
			"naive":    fmt.Sprintf("naive: 1 tx per message (%d msgs)", r.n),
			"jetinbox": "jetinbox consumer",
		}[name]
		vs := "-"
		if raw != nil {
			vs = fmt.Sprintf("%.2fx", r.rate()/raw.rate())
		}
		fmt.Fprintf(stdout, "%-38s %10.0f %9s\n", label, r.rate(), vs)
	}
	if j, n := results["jetinbox"], results["naive"]; j != nil && n != nil {
		fmt.Fprintf(stdout, "\njetinbox / naive: %.1fx\n", j.rate()/n.rate())
	}
	if len(lat) > 0 {
		fmt.Fprintf(stdout, "publish-to-commit at %d msg/s offered: p50 %v  p99 %v  max %v  (%d messages)\n",
			o.Rate, pct(lat, 50), pct(lat, 99), pct(lat, 100), len(lat))
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

func pubMode(batch int) string {
	if batch > 1 {
		return fmt.Sprintf("atomic batches of %d", batch)
	}
	return "one publish per intent"
}
