package shard

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/procstat"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// BenchmarkShardDelivery measures what nats-server spends delivering a
// sharded stream's stored messages and taking their acks, per message, for
// several ways of consuming the same messages, side by side, round after
// round, each against one durable on the whole stream:
//
//   - "1 durable": one durable, no filter (the single-durable path);
//   - "64 durables": a durable per partition, filter "<subject>.<p>.>", as
//     a shard runs today, every message on a subject of its own (its ID's
//     key token);
//   - "64 durables, coarse keys K": the same on a stream whose key token is
//     one of K tokens (K/64 per partition, each ID in the partition it has
//     today), so the stream holds few subjects;
//   - "1 durable, 64 filters", "2 durables × 32 filters", "4 durables ×
//     16 filters" and "16 durables × 4 filters": a durable per shard (1,
//     2, 4, 16 shards) whose FilterSubjects list its partitions, and the
//     4 shards' on the coarse keys' stream (key d4c16, run only when
//     named: the server spends over a millisecond per message there);
//   - "64 durables, 32 MiB pulls": a durable per partition, each pulling
//     with a shard's whole byte budget, so fewer pull requests;
//   - "64 streams, 1 durable each": a stream per partition (the producer
//     puts the partition in the subject), an unfiltered durable on each.
//
// The server runs as a child process (this test binary in the nats-server
// role), so its CPU, read from /proc, holds only the server; the client
// (pull subscriptions acking each message, as jsinbox does after a batch
// commits) runs here and its CPU is reported beside. With
// NATSCOST_EMBEDDED=1 the server runs in this process instead and "server"
// is the whole process (for -cpuprofile). NATSCOST_N sets the message
// count (default 1000, a smoke run), NATSCOST_ROUNDS the rounds (default 1),
// NATSCOST_ONLY a comma-separated list of variant keys (a, b, c1, c16, d1,
// d2, d4, d4c16, d16, e, f) to run; NATSCOST_CPUPROFILE=DIR writes a CPU profile of
// this process per variant and round while it consumes, DIR/KEY-rN.prof
// (with NATSCOST_EMBEDDED=1 it holds the server). A measurement, alone on
// the machine and once:
//
//	NATSCOST_N=100000 NATSCOST_ROUNDS=5 go test -run '^$' -bench BenchmarkShardDelivery -benchtime 1x ./internal/shard/
func BenchmarkShardDelivery(b *testing.B) {
	// Small by default: make test runs every benchmark once, to keep it
	// compiling and running; a measurement names its size.
	n := envInt(b, "NATSCOST_N", 1000)
	rounds := envInt(b, "NATSCOST_ROUNDS", 1)
	const parts = DefaultPartitions
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	var url, where string
	var serverCPU func() time.Duration
	if os.Getenv("NATSCOST_EMBEDDED") != "" {
		srv := natsenv.NewNATS(b, natsenv.NATSOptions{})
		url, serverCPU, where = srv.URL(), processCPU, "embedded: server and client CPU together"
	} else {
		procs := natsenv.NewNATSProcs(b, natsenv.NATSProcsOptions{})
		pid := procs.Pid(0)
		url, serverCPU, where = procs.URL(0), func() time.Duration { return procstat.CPU(pid) }, fmt.Sprintf("child process %d", pid)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}

	// The same intents on three streams: the ID's key token (today), and
	// coarse tokens, 1 and 16 per partition.
	intents := pipeline.Generate(pipeline.Load{Count: n, Accounts: 1024, Prefix: "s", Seed: 7})
	unique := (&Map{Partitions: parts}).WithDefaults()
	c1 := (&Map{Stream: "PC1", Subject: "pc1", Partitions: parts}).WithDefaults()
	c16 := (&Map{Stream: "PC16", Subject: "pc16", Partitions: parts}).WithDefaults()
	tok1, tok16 := coarseTokens(parts, 1), coarseTokens(parts, 16)
	// A stream per partition: the producer puts the partition in the
	// subject itself ("pp.<p>.<key>.<kind>", what the transform stores),
	// and each partition's stream captures its own.
	pp := (&Map{Subject: "pp", Partitions: parts}).WithDefaults()
	ppStreams := make([]string, parts)
	for p := range ppStreams {
		ppStreams[p] = fmt.Sprintf("PP%02d", p)
	}
	for _, s := range []struct {
		m       *Map
		streams []string // in place of the map's transformed stream
		subject func(id, kind string) string
	}{
		{m: &unique, subject: func(id, kind string) string { return PublishSubject(unique.Subject, id, kind) }},
		{m: &c1, subject: func(id, kind string) string { return c1.Subject + "." + coarseKey(tok1, id) + "." + kind }},
		{m: &c16, subject: func(id, kind string) string { return c16.Subject + "." + coarseKey(tok16, id) + "." + kind }},
		{m: &pp, streams: ppStreams, subject: func(id, kind string) string { return StoredSubject(pp.Subject, id, kind, parts) }},
	} {
		if s.streams == nil {
			if err := s.m.EnsureStream(ctx, js, jsinbox.StreamConfig{}); err != nil {
				b.Fatal(err)
			}
		}
		for p, name := range s.streams {
			// Bounded small: a server refuses streams whose MaxBytes
			// together exceed its storage.
			cfg := jsinbox.StreamConfig{Name: name, Subjects: []string{s.m.Filter(p)}, MaxBytes: 256 << 20}.Config()
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				b.Fatal(err)
			}
		}
		cpu0, t0 := serverCPU(), time.Now()
		for _, in := range intents {
			kind := strings.Replace(in.Subject, "intents.", "ledger.", 1)
			msg := &nats.Msg{Subject: s.subject(in.ID, kind), Data: in.Payload, Header: nats.Header{jetstream.MsgIDHeader: {in.ID}}}
			if _, err := js.PublishMsgAsync(msg); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatal("publishing did not complete")
		}
		el, cpu := time.Since(t0), serverCPU()-cpu0
		names := s.streams
		if names == nil {
			names = []string{s.m.Stream}
		}
		var msgs, subjects uint64
		for _, name := range names {
			info, err := js.Stream(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			msgs, subjects = msgs+info.CachedInfo().State.Msgs, subjects+info.CachedInfo().State.NumSubjects
		}
		if msgs != uint64(n) {
			b.Fatalf("streams %s hold %d messages, want %d", names[0], msgs, n)
		}
		fmt.Printf("%d stream(s) %s…: %d messages, %d subjects, published in %.1fs, server CPU %.1fµs/msg stored\n",
			len(names), names[0], msgs, subjects, el.Seconds(), float64(cpu.Nanoseconds())/1000/float64(n))
	}

	filters := func(m *Map, ps []int) []string {
		fs := make([]string, len(ps))
		for i, p := range ps {
			fs[i] = m.Filter(p)
		}
		return fs
	}
	perPartition := func(m *Map) [][]string {
		g := make([][]string, parts)
		for p := range g {
			g[p] = []string{m.Filter(p)}
		}
		return g
	}
	perShard := func(m *Map, k int) [][]string {
		g := make([][]string, k)
		for i := range g {
			var ps []int
			for p := i * parts / k; p < (i+1)*parts/k; p++ {
				ps = append(ps, p)
			}
			g[i] = filters(m, ps)
		}
		return g
	}
	const (
		shardBudget = 32 << 20 // a shard's pull budget: half of 64 MiB
		partBudget  = 512 << 10
	)
	all := []deliveryVariant{
		{key: "a", name: "1 durable", stream: unique.Stream, groups: [][]string{nil}, conns: 1, pullBytes: shardBudget},
		{key: "b", name: "64 durables", stream: unique.Stream, groups: perPartition(&unique), conns: 1, pullBytes: partBudget},
		{key: "c16", name: "64 durables, coarse keys 1024", stream: c16.Stream, groups: perPartition(&c16), conns: 1, pullBytes: partBudget},
		{key: "c1", name: "64 durables, coarse keys 64", stream: c1.Stream, groups: perPartition(&c1), conns: 1, pullBytes: partBudget},
		{key: "d1", name: "1 durable, 64 filters", stream: unique.Stream, groups: perShard(&unique, 1), conns: 1, pullBytes: shardBudget},
		{key: "d2", name: "2 durables × 32 filters", stream: unique.Stream, groups: perShard(&unique, 2), conns: 2, pullBytes: shardBudget},
		{key: "d4", name: "4 durables × 16 filters", stream: unique.Stream, groups: perShard(&unique, 4), conns: 4, pullBytes: shardBudget},
		{key: "d4c16", name: "4 durables × 16 filters, coarse keys 1024", stream: c16.Stream, groups: perShard(&c16, 4), conns: 4, pullBytes: shardBudget, slow: true},
		{key: "d16", name: "16 durables × 4 filters", stream: unique.Stream, groups: perShard(&unique, 16), conns: 16, pullBytes: shardBudget},
		{key: "f", name: "64 streams, 1 durable each", streams: ppStreams, groups: make([][]string, parts), conns: 1, pullBytes: partBudget},
		{key: "e", name: "64 durables, 32 MiB pulls", stream: unique.Stream, groups: perPartition(&unique), conns: 1, pullBytes: shardBudget},
	}
	variants := slices.DeleteFunc(slices.Clone(all), func(v deliveryVariant) bool { return v.slow })
	if only := os.Getenv("NATSCOST_ONLY"); only != "" {
		keys := strings.Split(only, ",")
		variants = slices.DeleteFunc(slices.Clone(all), func(v deliveryVariant) bool { return v.key != "a" && !slices.Contains(keys, v.key) })
	}
	results := make([][]deliveryResult, len(variants))
	for round := 1; round <= rounds; round++ {
		// Each round in another order, so that no variant always runs
		// first after publishing or right after another.
		for j := range variants {
			i := (j + round - 1) % len(variants)
			r, err := runDelivery(ctx, url, nc, serverCPU, variants[i], round, n)
			if err != nil {
				b.Fatalf("round %d, %s: %v", round, variants[i].name, err)
			}
			results[i] = append(results[i], r)
			fmt.Printf("round %d, %-30s server %6.1fµs/msg  client %6.1fµs/msg  %.4f pulls/msg  %7.0f msg/s\n", round, variants[i].name,
				r.serverPerMsg(n), r.clientPerMsg(n), float64(r.pulls)/float64(n), float64(n)/r.elapsed.Seconds())
		}
	}

	fmt.Printf("\nBenchmarkShardDelivery: %d messages stored once per stream (file storage, %d partitions), %d round(s), median (min–max); server: %s\n", n, parts, rounds, where)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "consumers\tdurables\tserver µs/msg\tvs 1 durable\tclient µs/msg\tvs 1 durable\tpulls/msg\tmsg/s\t")
	for i, v := range variants {
		var srv, cli, ratioS, ratioC, pulls, rate []float64
		for k, r := range results[i] {
			base := results[0][k]
			srv = append(srv, r.serverPerMsg(n))
			cli = append(cli, r.clientPerMsg(n))
			ratioS = append(ratioS, float64(r.server)/float64(base.server))
			ratioC = append(ratioC, float64(r.client)/float64(base.client))
			pulls = append(pulls, float64(r.pulls)/float64(n))
			rate = append(rate, float64(n)/r.elapsed.Seconds())
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%s\t%.1f\t%s\t%.4f\t%.0f\t\n", v.name, len(v.groups), median(srv), spread(ratioS), median(cli), spread(ratioC), median(pulls), median(rate))
		b.ReportMetric(median(srv)*1000, v.key+"-server-ns/msg")
		b.ReportMetric(median(pulls), v.key+"-pulls/msg")
	}
	tw.Flush()
}

// deliveryVariant is one way to consume the stream: a durable per group of
// filter subjects (a nil group: the whole stream), spread over conns
// connections, each pulling with pullBytes.

// streamOf is group i's stream.
func (v deliveryVariant) streamOf(i int) string {
	if v.streams != nil {
		return v.streams[i]
	}
	return v.stream
}

type deliveryVariant struct {
	key, name string
	stream    string
	// streams, if set, names each group's stream in place of stream.
	streams   []string
	groups    [][]string
	conns     int
	pullBytes int
	// slow variants run only when NATSCOST_ONLY names them.
	slow bool
}

type deliveryResult struct {
	server, client time.Duration
	elapsed        time.Duration
	pulls          uint64
}

func (r deliveryResult) serverPerMsg(n int) float64 {
	return float64(r.server.Nanoseconds()) / 1000 / float64(n)
}

func (r deliveryResult) clientPerMsg(n int) float64 {
	return float64(r.client.Nanoseconds()) / 1000 / float64(n)
}

// runDelivery creates the variant's durables, then, measured, consumes
// every message once, acking each as jsinbox does (after its batch, one
// ack message per message), until the server holds no ack pending; then it
// deletes the durables.
func runDelivery(ctx context.Context, url string, ctl *nats.Conn, serverCPU func() time.Duration, v deliveryVariant, round, want int) (deliveryResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cjs, err := jetstream.New(ctl)
	if err != nil {
		return deliveryResult{}, err
	}
	names := make([]string, len(v.groups))
	for i, g := range v.groups {
		names[i] = fmt.Sprintf("nc_r%d_%s_%d", round, v.key, i)
		if _, err := cjs.CreateConsumer(ctx, v.streamOf(i), jetstream.ConsumerConfig{
			Durable: names[i], AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: 20,
			MaxAckPending: 4 * 6000 * 2, MaxWaiting: 512, FilterSubjects: g,
		}); err != nil {
			return deliveryResult{}, err
		}
	}
	defer func() {
		for i, name := range names {
			_ = cjs.DeleteConsumer(context.WithoutCancel(ctx), v.streamOf(i), name)
		}
	}()

	type conn struct {
		nc   *nats.Conn
		js   jetstream.JetStream
		msgs chan jetstream.Msg
		out0 uint64
	}
	conns := make([]*conn, v.conns)
	for i := range conns {
		nc, err := nats.Connect(url)
		if err != nil {
			return deliveryResult{}, err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return deliveryResult{}, err
		}
		conns[i] = &conn{nc: nc, js: js, msgs: make(chan jetstream.Msg, 16384)}
	}
	// Durable i runs on connection i*conns/durables: a shard's durables
	// share the shard's connection.
	cons := make([]jetstream.Consumer, len(names))
	for i, name := range names {
		if cons[i], err = conns[i*len(conns)/len(names)].js.Consumer(ctx, v.streamOf(i), name); err != nil {
			return deliveryResult{}, err
		}
	}
	var acked, delivered atomic.Int64
	var ackers sync.WaitGroup
	stopAckers := make(chan struct{})
	for _, c := range conns {
		ackers.Add(1)
		go func() {
			defer ackers.Done()
			batch := make([]jetstream.Msg, 0, 6000)
			for {
				select {
				case m := <-c.msgs:
					batch = append(batch[:0], m)
				case <-stopAckers:
					return
				}
			fill:
				for len(batch) < cap(batch) {
					select {
					case m := <-c.msgs:
						batch = append(batch, m)
					default:
						break fill
					}
				}
				for _, m := range batch {
					_ = m.Ack()
				}
				acked.Add(int64(len(batch)))
			}
		}()
	}
	defer func() { close(stopAckers); ackers.Wait() }()

	for _, c := range conns {
		c.out0 = c.nc.Stats().OutMsgs
	}
	if dir := os.Getenv("NATSCOST_CPUPROFILE"); dir != "" {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-r%d.prof", v.key, round)))
		if err != nil {
			return deliveryResult{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return deliveryResult{}, err
		}
		defer pprof.StopCPUProfile()
	}
	cpu0, cli0, t0 := serverCPU(), processCPU(), time.Now()
	var ccs []jetstream.ConsumeContext
	defer func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}()
	for i, cn := range cons {
		c := conns[i*len(conns)/len(names)]
		cc, err := cn.Consume(func(m jetstream.Msg) {
			delivered.Add(1)
			c.msgs <- m
		}, jetstream.PullMaxBytes(v.pullBytes), jetstream.PullExpiry(5*time.Second))
		if err != nil {
			return deliveryResult{}, err
		}
		ccs = append(ccs, cc)
	}
	for acked.Load() < int64(want) {
		select {
		case <-ctx.Done():
			return deliveryResult{}, fmt.Errorf("%d of %d messages acked: %w", acked.Load(), want, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	var out uint64
	for _, c := range conns {
		if err := c.nc.FlushWithContext(ctx); err != nil {
			return deliveryResult{}, err
		}
		out += c.nc.Stats().OutMsgs - c.out0
	}
	// The acks are in; wait until the server has taken them all.
	for settled := false; !settled; {
		settled = true
		for i, name := range names {
			c, err := cjs.Consumer(ctx, v.streamOf(i), name)
			if err != nil {
				return deliveryResult{}, err
			}
			if ci := c.CachedInfo(); ci.NumAckPending > 0 || ci.NumPending > 0 {
				settled = false
				break
			}
		}
		if !settled {
			select {
			case <-ctx.Done():
				return deliveryResult{}, fmt.Errorf("acks not settled: %w", ctx.Err())
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	r := deliveryResult{server: serverCPU() - cpu0, client: processCPU() - cli0, elapsed: time.Since(t0), pulls: out - uint64(acked.Load())}
	if d := delivered.Load(); d != int64(want) {
		return r, fmt.Errorf("%d messages delivered, want %d (each once)", d, want)
	}
	return r, nil
}

// coarseTokens returns, for each of n partitions, per key tokens that the
// server's partition(n) puts in that partition.
func coarseTokens(n, per int) [][]string {
	out := make([][]string, n)
	for i, need := 0, n*per; need > 0; i++ {
		t := "c" + strconv.FormatInt(int64(i), 36)
		if p := Partition(t, n); len(out[p]) < per {
			out[p] = append(out[p], t)
			need--
		}
	}
	return out
}

// coarseKey is id's coarse key token: one of its partition's tokens, so
// that the ID stays in the partition its key puts it in.
func coarseKey(tokens [][]string, id string) string {
	sum := sha256.Sum256([]byte(id))
	ts := tokens[Partition(Key(id), len(tokens))]
	return ts[binary.BigEndian.Uint32(sum[8:12])%uint32(len(ts))]
}

// processCPU is the user and system CPU time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		b.Fatalf("%s=%q: want a positive number", name, s)
	}
	return v
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func spread(xs []float64) string {
	return fmt.Sprintf("%.2fx (%.2f–%.2f)", median(xs), slices.Min(xs), slices.Max(xs))
}
