package jsinboxtest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// BenchmarkConsume measures the consume path per message, as jetinbox bench
// runs it: b.N intents published beforehand, then consumed by a durable
// pull consumer on an embedded nats-server, "raw" acking each message and
// nothing else, "jetinbox" through the Consumer, the inbox and the ledger
// on PostgreSQL. The process holds the nats-server too, so allocs/op (per
// message) include the server's and the client's: the difference between
// the two is what the consumer, the inbox and the ledger add. Run with a
// fixed count, e.g. -benchtime 60000x.
func BenchmarkConsume(b *testing.B) {
	for _, name := range []string{"raw", "jetinbox"} {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			srv := natsenv.NewNATS(b, natsenv.NATSOptions{})
			nc, err := nats.Connect(srv.URL())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			if err != nil {
				b.Fatal(err)
			}
			pool, err := pgxpool.New(ctx, testenv.NewDatabase(b))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(pool.Close)
			stream := jsinbox.StreamConfig{}.WithDefaults()
			if err := pipeline.Setup(ctx, js, pool, stream, 1024); err != nil {
				b.Fatal(err)
			}
			// Publish b.N intents, untimed.
			pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{MaxInFlight: 8192})
			if err != nil {
				b.Fatal(err)
			}
			for _, in := range pipeline.Generate(pipeline.Load{Count: b.N, Accounts: 1024, Prefix: "c", Seed: 7}) {
				if err := pub.PublishAsync(ctx, in); err != nil {
					b.Fatal(err)
				}
			}
			if err := pub.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			pub.Close()
			cons, err := js.CreateOrUpdateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{
				Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 50_000, AckWait: time.Minute, MaxDeliver: 20,
			})
			if err != nil {
				b.Fatal(err)
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			goCPU, pgCPU := processCPU(os.Getpid()), postgresCPU(ctx, pool)
			b.ReportAllocs()
			b.ResetTimer()
			if name == "raw" {
				consumeRaw(rctx, b, cons, b.N)
			} else {
				consumeJetinbox(rctx, b, js, pool, stream.Name, b.N)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			// CPU per message, of this process (the nats-server, the
			// client, the consumer) and of the PostgreSQL server: on a
			// shared machine steadier than wall-clock time. A few messages
			// would report the start-up instead.
			if b.N < 1000 {
				return
			}
			if goCPU >= 0 {
				b.ReportMetric(float64((processCPU(os.Getpid())-goCPU).Microseconds())/float64(b.N), "go-cpu-µs/msg")
			}
			if pgCPU >= 0 {
				b.ReportMetric(float64((postgresCPU(ctx, pool)-pgCPU).Microseconds())/float64(b.N), "pg-cpu-µs/msg")
			}
		})
	}
}

// processCPU returns the user and system CPU time pid has used so far, or
// -1 where /proc cannot tell.
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return -1
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// postgresCPU returns the CPU time the processes of pool's PostgreSQL
// server (backends and background processes) have used so far, or -1.
func postgresCPU(ctx context.Context, pool *pgxpool.Pool) time.Duration {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity`)
	if err != nil {
		return -1
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return -1
	}
	var total time.Duration
	for _, pid := range pids {
		if t := processCPU(int(pid)); t > 0 {
			total += t
		}
	}
	return total
}

func consumeRaw(ctx context.Context, b *testing.B, c jetstream.Consumer, n int) {
	var got atomic.Int64
	done := make(chan struct{})
	cc, err := c.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		if got.Add(1) == int64(n) {
			close(done)
		}
	}, jetstream.PullMaxMessages(4096))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
}

type doneAfter struct {
	left atomic.Int64
	done chan struct{}
}

func (o *doneAfter) ObserveBatch(r jsinbox.BatchReport) {
	var k int64
	for _, out := range r.Outcomes {
		if out.Ackable() {
			k++
		}
	}
	if o.left.Add(-k) == 0 {
		close(o.done)
	}
}

func consumeJetinbox(ctx context.Context, b *testing.B, js jetstream.JetStream, pool *pgxpool.Pool, stream string, n int) {
	proc, err := inbox.NewProcessor(pginbox.New(pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		b.Fatal(err)
	}
	obs := &doneAfter{done: make(chan struct{})}
	obs.left.Store(int64(n))
	c, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{Stream: stream, Durable: "bench", AckWait: time.Minute,
		MaxAckPending: 50_000, Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	select {
	case <-obs.done:
	case err := <-done:
		b.Fatal(fmt.Sprint("consumer stopped: ", err))
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	stop()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
