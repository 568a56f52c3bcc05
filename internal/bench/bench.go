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
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/effects"
	"github.com/jetinbox/jetinbox/inbox"
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

func benchDB(ctx context.Context, pg *testenv.Postgres, name string, accounts int) (*pgxpool.Pool, error) {
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := inbox.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := effects.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	if err := effects.SeedAccounts(ctx, pool, accounts); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// runRaw is the ceiling of the pipe: fetch and ack, nothing else.
func runRaw(ctx context.Context, c jetstream.Consumer, _ *pgxpool.Pool, n int) error {
	var got atomic.Int64
	done := make(chan struct{})
	cc, err := c.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		if got.Add(1) == int64(n) {
			close(done)
		}
	}, jetstream.PullMaxMessages(4096))
	if err != nil {
		return err
	}
	defer cc.Stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runNaive is what most people write: one transaction per message on one
// connection, then ack.
func runNaive(ctx context.Context, c jetstream.Consumer, pool *pgxpool.Pool, n int) error {
	proc, err := inbox.NewProcessor(pool, inbox.Config{Scope: "ledger", Handler: effects.NewLedger()})
	if err != nil {
		return err
	}
	it, err := c.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return err
	}
	defer it.Stop()
	for i := 0; i < n; i++ {
		m, err := it.Next()
		if err != nil {
			return err
		}
		msg := jsinbox.MessageOf(m)
		out, err := proc.Process(ctx, []inbox.Message{msg})
		if err != nil || !out[0].Ackable() {
			return fmt.Errorf("naive: %v %v", err, out[0].Reason)
		}
		_ = m.Ack()
	}
	return nil
}

type countObserver struct {
	applied atomic.Int64
	done    chan struct{}
	n       int64
	once    sync.Once
	mu      sync.Mutex
	lat     []time.Duration
	latency bool
}

func (o *countObserver) ObserveBatch(b jsinbox.BatchReport) {
	var k int64
	for i, out := range b.Outcomes {
		if out.Ackable() {
			k++
			if o.latency {
				o.mu.Lock()
				o.lat = append(o.lat, b.Ended.Sub(b.Messages[i].Published))
				o.mu.Unlock()
			}
		}
	}
	if o.applied.Add(k) >= o.n {
		o.once.Do(func() { close(o.done) })
	}
}

func runJetinbox(ctx context.Context, js jetstream.JetStream, c jetstream.Consumer, pool *pgxpool.Pool, n int, o Options) error {
	obs := &countObserver{done: make(chan struct{}), n: int64(n)}
	return consumeWith(ctx, js, c, pool, o, obs, func() error {
		select {
		case <-obs.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// consumeWith runs o.Consumers jetinbox consumers on c's durable (each with
// its own processor, as separate processes would be) until wait returns.
func consumeWith(ctx context.Context, js jetstream.JetStream, c jetstream.Consumer, pool *pgxpool.Pool, o Options, obs jsinbox.Observer, wait func() error) error {
	info := c.CachedInfo()
	k := max(o.Consumers, 1)
	all := make([]*jsinbox.Consumer, k)
	for i := range all {
		proc, err := inbox.NewProcessor(pool, inbox.Config{Scope: "ledger", Handler: effects.NewLedger()})
		if err != nil {
			return err
		}
		all[i], err = jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{
			Stream: info.Stream, Durable: info.Name, BatchSize: o.Batch, InFlight: o.InFlight,
			AckWait: time.Minute, MaxAckPending: 50_000, DB: pool, Observer: obs,
			DeliverPolicy: info.Config.DeliverPolicy, OptStartSeq: info.Config.OptStartSeq,
		})
		if err != nil {
			return err
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, k)
	for _, cons := range all {
		go func() { done <- cons.Run(rctx) }()
	}
	waited := make(chan error, 1)
	go func() {
		// Start the clock of a latency phase once the consumers are
		// connected, warmed up and pulling, as a running service is.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			ready := 0
			for _, cons := range all {
				if cons.Ready() {
					ready++
				}
			}
			if ready == k {
				break
			}
		}
		waited <- wait()
	}()
	select {
	case err := <-done: // a consumer stopped on its own: a failure
		return fmt.Errorf("consumer stopped: %v", err)
	case werr := <-waited:
		cancel()
		for range k {
			if err := <-done; err != nil {
				return err
			}
		}
		return werr
	}
}

// latencyPhase offers a steady low rate and measures publish-to-commit.
func latencyPhase(ctx context.Context, js jetstream.JetStream, pg *testenv.Postgres, o Options) ([]time.Duration, error) {
	pool, err := benchDB(ctx, pg, "latency", o.Accounts)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	s, err := js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		return nil, err
	}
	si, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	c, err := js.CreateOrUpdateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{
		Durable: "latency", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq: si.State.LastSeq + 1, AckWait: time.Minute, MaxAckPending: 50_000, MaxDeliver: 20,
	})
	if err != nil {
		return nil, err
	}
	total := int(float64(o.Rate) * o.Latency.Seconds())
	obs := &countObserver{done: make(chan struct{}), n: int64(total), latency: true}
	intents := pipeline.Generate(pipeline.Load{Count: total, Accounts: o.Accounts, HotAccount: o.Hot, Prefix: "lat", Seed: 9})
	err = consumeWith(ctx, js, c, pool, o, obs, func() error {
		pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
		if err != nil {
			return err
		}
		defer pub.Close()
		tick := time.NewTicker(time.Second / time.Duration(o.Rate))
		defer tick.Stop()
		for _, in := range intents {
			<-tick.C
			if err := pub.Publish(ctx, in); err != nil {
				return err
			}
		}
		select {
		case <-obs.done:
			return nil
		case <-time.After(time.Minute):
			return errors.New("latency phase: not every message committed within a minute")
		}
	})
	if err != nil {
		return nil, err
	}
	var want int64
	for _, in := range intents {
		p, _ := effects.ParseIntent(in.Payload)
		want += p.Amount
	}
	if err := checkLedger(ctx, pool, len(intents), want); err != nil {
		return nil, err
	}
	return obs.lat, nil
}

// checkLedger: every ID exactly once, balances exact.
func checkLedger(ctx context.Context, pool *pgxpool.Pool, n int, want int64) error {
	var entries, distinct int
	var total int64
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id), coalesce(sum(amount), 0) FROM ledger_entries`).Scan(&entries, &distinct, &total); err != nil {
		return err
	}
	var bal int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0) FROM accounts`).Scan(&bal); err != nil {
		return err
	}
	if entries != n || distinct != n || total != want || bal != want {
		return fmt.Errorf("ledger check failed: %d entries, %d distinct IDs (want %d), amounts %d, balances %d (want %d)",
			entries, distinct, n, total, bal, want)
	}
	return nil
}

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))].Round(100 * time.Microsecond)
}

func sampleHeap(peak *atomic.Uint64) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-t.C:
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
			case <-done:
				return
			}
		}
	}()
	return func() { close(done) }
}

func mib(b uint64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// peakRSS is this process's VmHWM.
func peakRSS() string {
	if v := vmHWM(os.Getpid()); v != "" {
		return v
	}
	return "unknown"
}

type childResult struct {
	rate    float64
	peakRSS string
	// earlyRSS is the peak after a quarter of the messages: memory bounded
	// by the configuration stops growing long before the stream ends.
	earlyRSS string
}

// childConsumer runs `jetinbox consumer` (this binary) as a separate process
// on a fresh durable and database, waits until it applied every message, and
// reads its peak RSS (VmHWM) before stopping it.
func childConsumer(ctx context.Context, natsURL string, pg *testenv.Postgres, o Options, want int64) (*childResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	pool, err := benchDB(ctx, pg, "child", o.Accounts)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	cmd := exec.CommandContext(ctx, exe, "consumer", "-http", "", "-durable", "child", "-batch", strconv.Itoa(o.Batch),
		"-inflight", strconv.Itoa(o.InFlight), "-max-ack-pending", "50000", "-log-format", "json")
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL, "DATABASE_URL="+pg.URL("child"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var rss, early string
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&n); err != nil {
			return nil, err
		}
		if v := vmHWM(cmd.Process.Pid); v != "" {
			rss = v
			if early == "" && n >= o.N/4 {
				early = v
			}
		}
		if n >= o.N {
			break
		}
		if time.Since(start) > 10*time.Minute {
			return nil, fmt.Errorf("child consumer: %d of %d after 10 minutes:\n%s", n, o.N, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	el := time.Since(start)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := checkLedger(ctx, pool, o.N, want); err != nil {
		return nil, err
	}
	pool.Close()
	if err := pg.DropDatabase(ctx, "child"); err != nil {
		return nil, err
	}
	return &childResult{rate: float64(o.N) / el.Seconds(), peakRSS: rss, earlyRSS: early}, nil
}

func vmHWM(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.Atoi(f[1])
			return fmt.Sprintf("%d MiB", kb/1024)
		}
	}
	return ""
}
