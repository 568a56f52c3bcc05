package jsinboxtest

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// benchStream is a server that fsyncs every write (sync_interval: always,
// as deployed) and the intents stream on it.
func benchStream(b *testing.B) jetstream.JetStream {
	b.Helper()
	srv := natsenv.NewNATS(b, natsenv.NATSOptions{SyncAlways: true})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jsinbox.StreamConfig{}.Config()); err != nil {
		b.Fatal(err)
	}
	return js
}

var benchRun atomic.Int64

// benchIntent is the i-th intent of a benchmark run: IDs never repeat
// across runs on the same stream.
func benchIntent(run int64, i int64) inbox.Intent {
	return inbox.Intent{ID: fmt.Sprintf("bench-%d-%d", run, i), Subject: "intents.bench", Payload: []byte(`{"account":1,"amount":1}`)}
}

// publishModes runs publish under group commit (the default) and one
// publish per intent, each on a fresh stream with sync_interval: always,
// and reports the throughput of the whole run in msg/s.
func publishModes(b *testing.B, publish func(b *testing.B, p *jsinbox.Publisher, run int64)) {
	for _, c := range []struct {
		name  string
		batch int
	}{{"group-commit", 0}, {"one-by-one", 1}} {
		b.Run(c.name, func(b *testing.B) {
			js := benchStream(b)
			p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{Batch: c.batch, AckTimeout: 30 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			run := benchRun.Add(1)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			publish(b, p, run)
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
			if st := p.Stats(); st.Failed > 0 {
				b.Fatalf("stats %+v", st)
			}
		})
	}
}

// BenchmarkPublishCallers: 64 goroutines each publishing one intent at a
// time and waiting for its PubAck (a service publishing one intent per
// request), with group commit and one publish per intent. allocs/op are
// per intent.
func BenchmarkPublishCallers(b *testing.B) {
	publishModes(b, func(b *testing.B, p *jsinbox.Publisher, run int64) {
		b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0))) // 64 callers
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := p.Publish(context.Background(), benchIntent(run, next.Add(1))); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkPublishAsync: one goroutine handing intents to Publish, then
// Flush (the producer's way), with group commit and one publish per intent.
func BenchmarkPublishAsync(b *testing.B) {
	publishModes(b, func(b *testing.B, p *jsinbox.Publisher, run int64) {
		ctx := context.Background()
		for i := range b.N {
			if err := p.PublishAsync(ctx, benchIntent(run, int64(i))); err != nil {
				b.Fatal(err)
			}
		}
		if err := p.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	})
}
