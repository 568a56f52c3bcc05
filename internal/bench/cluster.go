// `jetinbox bench -cluster`: the same measurements on three embedded nodes
// with R3 streams and consumers, plus the producer's rate on one node and
// on three, with and without sync_interval: always.

package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// setupCeiling bounds each step that sets a cluster run up (a stream, a
// durable): each retries until it is done, and a cluster on a loaded
// machine (a CI run beside other cluster tests) can take more than a
// minute to place an R3 stream.
const setupCeiling = 3 * time.Minute

// ClusterOptions of a cluster bench run.
type ClusterOptions struct {
	// N messages per consumer measurement.
	N int
	// ProducerN intents per producer measurement.
	ProducerN int
	// ProducerOnly measures the producer rates and nothing else.
	ProducerOnly bool
	// ProducerBatch is the atomic batch size of the batched producer rows.
	ProducerBatch int
	// Consumers lists the consumer counts to measure jetinbox with, all
	// on the one durable (scaling out).
	Consumers []int
	// Batch, InFlight and Accounts as in [Options].
	Batch, InFlight, Accounts int
	// Latency and Rate: the publish-to-commit phase (0 skips it).
	Latency time.Duration
	Rate    int
	// Processes also runs each consumer count as that many `jetinbox
	// consumer` processes (this binary must be jetinbox).
	Processes bool
}

// ProducerRate is one producer measurement.
type ProducerRate struct {
	Replicas   int
	SyncAlways bool
	Batch      int
	Rate       float64
}

// ConsumerRate is one consumer measurement on R3: its rate and what each
// message cost this process (three nats-servers and the consumers) in CPU
// and PostgreSQL in WAL.
type ConsumerRate struct {
	Approach   string
	Consumers  int
	Rate       float64
	CPUPerMsg  time.Duration
	WALPerMsg  float64
	BatchesPer float64 // messages per committed transaction
}

// ClusterResult is what a cluster bench run measured.
type ClusterResult struct {
	Producer []ProducerRate
	Consumer []ConsumerRate
	// Latency: publish-to-commit at Rate offered, on R3.
	Latency []time.Duration
}

// ClusterMain is `jetinbox bench -cluster`: its own flags, after -cluster.
func ClusterMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox bench -cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := ClusterOptions{}
	var consumers string
	fs.IntVar(&o.N, "n", 50_000, "messages per consumer measurement")
	fs.IntVar(&o.ProducerN, "producer-n", 20_000, "intents per producer measurement")
	fs.BoolVar(&o.ProducerOnly, "producer", false, "measure only the producer: one node and three, sync_interval default and always, one by one and in atomic batches")
	fs.IntVar(&o.ProducerBatch, "publish-batch", 1000, "atomic batch size of the batched producer rows")
	fs.StringVar(&consumers, "consumers", "1,2,4", "jetinbox consumer counts on the one durable, comma separated")
	fs.IntVar(&o.Batch, "batch", 6000, "jetinbox: most messages per transaction")
	fs.IntVar(&o.InFlight, "inflight", 2, "jetinbox: batches in flight")
	fs.IntVar(&o.Accounts, "accounts", 1024, "accounts the effect spreads over")
	fs.DurationVar(&o.Latency, "latency", 5*time.Second, "length of the publish-to-commit phase (0 skips it)")
	fs.IntVar(&o.Rate, "rate", 1000, "offered msg/s in the publish-to-commit phase")
	fs.BoolVar(&o.Processes, "processes", true, "also run each consumer count as separate jetinbox consumer processes on the one durable")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox bench -cluster: on three embedded nats-servers with R3 streams (sync_interval: always)\n"+
			"and a throwaway PostgreSQL: raw fetch+ack vs jetinbox with 1, 2, 4 consumers, publish-to-commit\n"+
			"latency, and the producer's rate on one node and on three.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError{Err: fmt.Errorf("bench -cluster: unexpected arguments %q", fs.Args())}
	}
	for _, s := range strings.Split(consumers, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k < 1 {
			return cli.UsageError{Err: fmt.Errorf("bench -cluster: -consumers: %q is not a positive count", s)}
		}
		o.Consumers = append(o.Consumers, k)
	}
	if o.N < 1 || o.ProducerN < 1 || o.Batch < 1 || o.InFlight < 1 || o.Accounts < 1 || o.Rate < 1 || o.Latency < 0 ||
		o.ProducerBatch < 2 || o.ProducerBatch > jsinbox.MaxBatch {
		return cli.UsageError{Err: fmt.Errorf("bench -cluster: -n, -producer-n, -batch, -inflight, -accounts and -rate must be positive, -latency not negative, -publish-batch 2..%d", jsinbox.MaxBatch)}
	}
	res, err := RunCluster(ctx, o, stderr)
	if err != nil {
		return err
	}
	res.Write(stdout, o)
	return nil
}

// RunCluster measures the producer, and unless ProducerOnly the consumers,
// and returns the figures.
func RunCluster(ctx context.Context, o ClusterOptions, progress io.Writer) (*ClusterResult, error) {
	say := func(format string, a ...any) { fmt.Fprintf(progress, format+"\n", a...) }
	res := &ClusterResult{}
	for _, replicas := range []int{1, 3} {
		for _, sync := range []bool{false, true} {
			for _, batch := range []int{0, o.ProducerBatch} {
				r, err := producerRate(ctx, replicas, sync, batch, o.ProducerN)
				if err != nil {
					return nil, fmt.Errorf("bench -cluster: producer R%d: %w", replicas, err)
				}
				say("producer R%d sync_interval %s, %s: %.0f intents/s", replicas, syncName(sync), pubMode(batch), r)
				res.Producer = append(res.Producer, ProducerRate{Replicas: replicas, SyncAlways: sync, Batch: batch, Rate: r})
			}
		}
	}
	if o.ProducerOnly {
		return res, nil
	}
	if err := consumersOnR3(ctx, o, res, say); err != nil {
		return nil, fmt.Errorf("bench -cluster: %w", err)
	}
	return res, nil
}

func syncName(always bool) string {
	if always {
		return "always"
	}
	return "default"
}

// producerRate publishes n intents through jsinbox's Publisher into a
// fresh stream on fresh servers (one node, or three with R3) and returns
// the rate at which they were acknowledged.
func producerRate(ctx context.Context, replicas int, syncAlways bool, batch, n int) (float64, error) {
	var url string
	if replicas == 1 {
		srv, err := natsenv.StartNATS(natsenv.NATSOptions{SyncAlways: syncAlways})
		if err != nil {
			return 0, err
		}
		defer srv.Close()
		url = srv.URL()
	} else {
		cl, err := natsenv.StartCluster(ctx, natsenv.ClusterOptions{SyncAlways: syncAlways})
		if err != nil {
			return 0, err
		}
		defer cl.Close()
		url = cl.URLs()
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	cfg := jsinbox.StreamConfig{Replicas: replicas}.WithDefaults()
	sctx, cancel := context.WithTimeout(ctx, setupCeiling)
	_, err = natsenv.CreateStream(sctx, js, cfg.Config())
	cancel()
	if err != nil {
		return 0, err
	}
	intents := pipeline.Generate(pipeline.Load{Count: n, Accounts: 1024, Prefix: "p", Seed: 3})
	// A window the slowest row (one fsync per publish on one node) acks
	// well within AckTimeout: a bigger one only times out and retries.
	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{MaxInFlight: 1024, AckTimeout: 10 * time.Second, Batch: batch})
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	t0 := time.Now()
	for _, in := range intents {
		if err := pub.PublishAsync(ctx, in); err != nil {
			return 0, err
		}
	}
	if err := pub.Flush(ctx); err != nil {
		return 0, err
	}
	el := time.Since(t0)
	if s := pub.Stats(); s.Failed > 0 || s.Published != int64(n) {
		return 0, fmt.Errorf("%d of %d intents failed (%d published)", s.Failed, n, s.Published)
	}
	return float64(n) / el.Seconds(), nil
}

// consumersOnR3 publishes N messages into an R3 stream on three nodes
// (sync_interval: always) and consumes them with the raw pipe and with
// jetinbox at each consumer count, then runs the latency phase.
func consumersOnR3(ctx context.Context, o ClusterOptions, res *ClusterResult, say func(string, ...any)) error {
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Durable: true})
	if err != nil {
		return err
	}
	defer pg.Close()
	cl, err := natsenv.StartCluster(ctx, natsenv.ClusterOptions{SyncAlways: true})
	if err != nil {
		return err
	}
	defer cl.Close()
	nc, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream := jsinbox.StreamConfig{Replicas: 3}.WithDefaults()
	sctx, cancel := context.WithTimeout(ctx, setupCeiling)
	for {
		_, err = jsinbox.EnsureStream(sctx, js, stream)
		if err == nil || sctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	cancel()
	if err != nil {
		return err
	}
	intents := pipeline.Generate(pipeline.Load{Count: o.N, Accounts: o.Accounts, Prefix: "b", Seed: 7})
	var want int64
	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{MaxInFlight: 8192, Batch: jsinbox.MaxBatch})
	if err != nil {
		return err
	}
	for _, in := range intents {
		if err := pub.PublishAsync(ctx, in); err != nil {
			pub.Close()
			return err
		}
	}
	err = pub.Flush(ctx)
	pub.Close()
	if err != nil {
		return err
	}
	for _, in := range intents {
		want += amountOf(in)
	}
	say("published %d messages into R3 stream %s", o.N, stream.Name)

	type run struct {
		name      string
		consumers int
	}
	runs := []run{{"raw", 0}}
	for _, k := range o.Consumers {
		runs = append(runs, run{"jetinbox", k})
	}
	for i, r := range runs {
		durable := fmt.Sprintf("%s_%d_%d", r.name, r.consumers, i)
		pool, err := benchDB(ctx, pg, durable, o.Accounts)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, setupCeiling)
		cons, err := natsenv.CreateConsumer(cctx, js, stream.Name, jetstream.ConsumerConfig{
			Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 50_000, AckWait: time.Minute, MaxDeliver: 20,
		})
		cancel()
		if err != nil {
			pool.Close()
			return err
		}
		wal0, werr := walLSN(ctx, pool)
		cpu0 := cpuTime()
		start := time.Now()
		if r.name == "raw" {
			err = runRaw(ctx, cons, &cli.Store{PG: pool}, o.N)
		} else {
			err = runJetinbox(ctx, js, cons, &cli.Store{PG: pool}, o.N, Options{Batch: o.Batch, InFlight: o.InFlight, Consumers: r.consumers})
		}
		el := time.Since(start)
		cpu := cpuTime() - cpu0
		var walBytes float64
		if wal1, err2 := walLSN(ctx, pool); werr == nil && err2 == nil {
			_ = pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)`, wal1, wal0).Scan(&walBytes)
		}
		var xacts float64
		if err == nil && r.name != "raw" {
			err = checkLedger(ctx, &cli.Store{PG: pool}, o.N, want)
			_ = pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text)::float8 FROM ledger_entries`).Scan(&xacts)
		}
		pool.Close()
		if err != nil {
			return fmt.Errorf("%s ×%d: %w", r.name, r.consumers, err)
		}
		if err := pg.DropDatabase(ctx, durable); err != nil {
			return err
		}
		if err := js.DeleteConsumer(ctx, stream.Name, durable); err != nil {
			return err
		}
		cr := ConsumerRate{Approach: r.name, Consumers: r.consumers, Rate: float64(o.N) / el.Seconds(), CPUPerMsg: cpu / time.Duration(o.N)}
		if r.name != "raw" {
			cr.WALPerMsg = walBytes / float64(o.N)
			if xacts > 0 {
				cr.BatchesPer = float64(o.N) / xacts
			}
		}
		res.Consumer = append(res.Consumer, cr)
		say("%s with %d consumer(s): %d msgs in %.2fs = %.0f msg/s", r.name, r.consumers, o.N, el.Seconds(), cr.Rate)
	}
	if o.Processes {
		for _, k := range o.Consumers {
			cr, err := processConsumers(ctx, js, cl.URLs(), stream.Name, pg, o, k, want)
			if err != nil {
				return err
			}
			res.Consumer = append(res.Consumer, cr)
			say("%d jetinbox consumer processes: %.0f msg/s, %v CPU per message in the processes", k, cr.Rate, cr.CPUPerMsg)
		}
	}
	if o.Latency > 0 {
		if err := pg.Settle(ctx, 30*time.Second); err != nil {
			return err
		}
		run, err := latencyPhase(ctx, js, pgDatabases{pg}, Options{Accounts: o.Accounts, Batch: o.Batch, InFlight: o.InFlight, Consumers: 1, Rate: o.Rate, Latency: o.Latency}, o.Rate, "latency")
		if err != nil {
			return err
		}
		res.Latency = run.lat
	}
	return nil
}

func amountOf(in inbox.Intent) int64 {
	p, err := effects.ParseIntent(in.Payload)
	if err != nil {
		return 0 // generated payloads are valid; checkLedger would fail
	}
	return p.Amount
}

func walLSN(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var lsn string
	err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// cpuTime is the CPU time this process used so far (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Write prints the result as tables.
func (r *ClusterResult) Write(w io.Writer, o ClusterOptions) {
	fmt.Fprintf(w, "\nproducer (jsinbox Publisher, %d intents per row, fresh servers per row)\n", o.ProducerN)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "stream\tsync_interval\tpublishing\tintents/s")
	for _, p := range r.Producer {
		fmt.Fprintf(tw, "R%d\t%s\t%s\t%.0f\n", p.Replicas, syncName(p.SyncAlways), pubMode(p.Batch), p.Rate)
	}
	tw.Flush()
	if len(r.Consumer) == 0 {
		return
	}
	fmt.Fprintf(w, "\nconsumers on R3 (three nodes, sync_interval: always), %d messages, batch ≤ %d, %d in flight\n", o.N, o.Batch, o.InFlight)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "approach\tconsumers\tmsg/s\tvs raw\tCPU/msg\tWAL/msg\tmsgs/transaction")
	var raw float64
	for _, c := range r.Consumer {
		if c.Approach == "raw" {
			raw = c.Rate
		}
	}
	for _, c := range r.Consumer {
		vs, wal, per, k := "-", "-", "-", "-"
		if raw > 0 {
			vs = fmt.Sprintf("%.2fx", c.Rate/raw)
		}
		if c.Approach != "raw" {
			wal = fmt.Sprintf("%.0f B", c.WALPerMsg)
			per = fmt.Sprintf("%.0f", c.BatchesPer)
			k = strconv.Itoa(c.Consumers)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%v\t%s\t%s\n", c.Approach, k, c.Rate, vs, c.CPUPerMsg.Round(100*time.Nanosecond), wal, per)
	}
	tw.Flush()
	if len(r.Latency) > 0 {
		fmt.Fprintf(w, "\npublish-to-commit on R3 at %d msg/s offered: p50 %v  p99 %v  max %v  (%d messages)\n",
			o.Rate, pct(r.Latency, 50), pct(r.Latency, 99), pct(r.Latency, 100), len(r.Latency))
	}
	fmt.Fprintln(w, "CPU/msg: in-process rows count this process (three nats-servers and the consumers); process rows only the consumer processes")
	fmt.Fprintln(w, "ledger verified after every consumer row: every ID exactly once, balances exact")
}
