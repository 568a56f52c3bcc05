package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/shard"
)

func TestShardsBenchFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-shards"}, {"-shards", "1,x"}, {"-shards", "0"}, {"-shards=1,2", "-n", "0"}, {"--shards", "1", "extra"},
		{"-shards", "128"}, {"-shards", "1", "-model-hosts", "2,-1"}, {"-shards", "1", "-partitions", "2000"},
	} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), args, &out, &errOut)
		if err == nil || !strings.HasPrefix(err.Error(), "bench -shards: ") || cli.ExitCode(err) != 2 {
			t.Errorf("%q: %v (exit %d, want 2 and the sharded run's own check)", args, err, cli.ExitCode(err))
		}
	}
	var errOut bytes.Buffer
	if err := Main(context.Background(), []string{"-n", "5", "-shards", "1", "-h"}, io.Discard, &errOut); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(errOut.String(), "Usage of jetinbox bench -shards") || !strings.Contains(errOut.String(), "-nats-cores") {
		t.Errorf("bench -shards 1 -h: %v\n%s", err, errOut.String())
	}
}

// TestShardsModel: each host is bound by its PostgreSQL's CPU per message
// until the hosts together would need more of NATS than it has; from
// there on the aggregate is NATS's ceiling.
func TestShardsModel(t *testing.T) {
	m := Model{Costs: Costs{PG: 20 * time.Microsecond, Consumer: 10 * time.Microsecond, Process: 30 * time.Microsecond, Store: 10 * time.Microsecond, WALBytes: 500},
		HostCores: 2, NATSCores: 8}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-6*max(1, want) }
	if !near(m.HostCeiling(), 100_000) || !near(m.NATSCeiling(), 200_000) || m.HostsBound() != 2 {
		t.Fatalf("host ceiling %v, NATS ceiling %v, hosts bound %d; want 100000, 200000, 2", m.HostCeiling(), m.NATSCeiling(), m.HostsBound())
	}
	for _, c := range []struct {
		hosts                     int
		agg, perHost              float64
		natsBound                 bool
		natsCores, consCores, wal float64
	}{
		{1, 100_000, 100_000, false, 4, 1, 50},
		{2, 200_000, 100_000, false, 8, 2, 50},
		{4, 200_000, 50_000, true, 16, 2, 25},
		{16, 200_000, 12_500, true, 64, 2, 6.25},
	} {
		r := m.Row(c.hosts)
		if !near(r.Aggregate, c.agg) || !near(r.PerHost, c.perHost) || r.NATSBound != c.natsBound ||
			!near(r.NATSCoresNeeded, c.natsCores) || !near(r.ConsumerCores, c.consCores) || !near(r.WALMBps, c.wal) {
			t.Errorf("%d hosts: %+v, want %+v", c.hosts, r, c)
		}
	}
	if got := m.OneMachine(); !near(got, 2/70e-6) {
		t.Errorf("one machine: %v msg/s, want %v", got, 2/70e-6)
	}
	// NATS dearer than a host's PostgreSQL with as many cores: it binds
	// from the first host.
	m.NATSCores = 2
	if m.HostsBound() != 0 || !m.Row(1).NATSBound {
		t.Errorf("NATS at 2 cores: hosts bound %d, 1 host NATS-bound %v; want 0, true", m.HostsBound(), m.Row(1).NATSBound)
	}
}

// TestShardsBench runs 1 and 2 shards small, the consumers in this process:
// each shard applies its partitions' messages on its own PostgreSQL, the
// ledgers and verify -shards are checked, the figures are there. Then the
// same with the bench's expectation of who owns a message computed by a
// partition function that is not the server's: the per-shard check must
// fail, so it does check where the stream's transform put each message.
func TestShardsBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two PostgreSQL servers and a nats-server")
	}
	ctx := context.Background()
	var progress bytes.Buffer
	o := ShardsOptions{Counts: []int{1, 2}, N: 3000, Accounts: 64, Batch: 500, InFlight: 2, Rounds: 1, Progress: &progress, OneDurable: true, ShardDurables: true}
	res, err := RunShards(ctx, o)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var out bytes.Buffer
	res.Write(&out)
	t.Logf("\n%s", out.String())
	if !res.Verified || len(res.Rows) != 5 {
		t.Fatalf("verified %v, %d rows", res.Verified, len(res.Rows))
	}
	for _, row := range res.Rows {
		r := row.Rounds[0]
		n := 0
		for _, s := range r.Shards {
			n += s.Msgs
			if s.Msgs == 0 || s.WALBytes <= 0 || s.Elapsed <= 0 {
				t.Errorf("%d shards: shard %s: %d messages, %.0f WAL bytes, %v", row.Shards, s.Name, s.Msgs, s.WALBytes, s.Elapsed)
			}
		}
		if len(r.Shards) != row.Shards || n != o.N || r.ProcCPU <= 0 {
			t.Errorf("%d shards: %d shard figures, %d messages of %d, process CPU %v", row.Shards, len(r.Shards), n, o.N, r.ProcCPU)
		}
	}
	for _, want := range []string{
		`(?m)^ +1 durable +\d+ +1\.00x +\d+ +\d+\.\dµs +- +\d+\.\dµs +\d+ B +\d\.\d\d of \d+ +- +- *$`,
		`(?m)^ +1 shard +\d+ +\d+\.\d\dx +\d+ +\d+\.\dµs +- +\d+\.\dµs +\d+ B +\d\.\d\d of \d+ +\d+\.\d\dx +\d+\.\d\dx *$`,
		`(?m)^ +2 shards +\d+ +\d+\.\d\dx +\d+ \d+ +\d+\.\dµs `,
		`(?m)^ +2 shards +s1 +32-63 +\d+ +\d+ `,
		`(?m)^ +1, a durable per shard +\d+ +\d+\.\d\dx +\d+ +\d+\.\dµs +- +\d+\.\dµs +\d+ B +\d\.\d\d of \d+ +\d+\.\d\dx +\d+\.\d\dx *$`,
		`(?m)^ +2, a durable per shard +s1 +32-63 +\d+ +\d+ `,
		`(?m)^model, a durable per shard: N hosts`,
		`(?m)^ +1 durable +one +0-63 +3000 `,
		`(?m)^  NATS CPU per message +\d+\.\dµs  → the stream's ceiling \d+ msg/s`,
		`(?m)^ +16 +\d+ +\d+ +(NATS|the hosts' PostgreSQL) +\d+\.\d +- +\d+\.\d MB/s *$`,
		`(?m)^ledgers verified after every row`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("output lacks %s", want)
		}
	}

	o.Counts, o.N, o.ShardDurables = []int{2}, 300, false
	o.partitionOf = func(id string, n int) int { return shard.PartitionOf(id+" ", n) }
	_, err = RunShards(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "more than its partitions' messages hold") {
		t.Fatalf("with a partition function that is not the server's, the run says %v; want a shard's check to fail", err)
	}
	t.Logf("with a partition function that is not the server's: %v", err)
}

// BenchmarkShards is the command, small, for bench-smoke: 1 and 2 shards
// on PostgreSQL servers of their own, the consumers in this process.
func BenchmarkShards(b *testing.B) {
	for b.Loop() {
		var out bytes.Buffer
		err := Main(context.Background(), []string{"-shards", "1,2", "-n", "3000", "-accounts", "64", "-batch", "500", "-rounds", "1", "-processes=false", "-beside-shard-durables=false"}, &out, io.Discard)
		if err != nil || !strings.Contains(out.String(), "ledgers verified") {
			b.Fatalf("bench -shards 1,2: %v\n%s", err, out.String())
		}
	}
}
