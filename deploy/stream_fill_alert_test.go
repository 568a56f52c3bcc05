package deploy_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetinbox/jetinbox/effects"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/metrics"
)

// consumerTarget is the consumer's address in the compose stack, as
// prometheus.yml scrapes it.
const consumerTarget = "consumer:8080"

// TestStreamFillingAlertFires runs a consumer with its metrics on a stream
// whose max_msgs is small, scrapes its /metrics as the consumer's job, and
// evaluates the JetinboxStreamFilling expression from alerts.yml with
// Prometheus's engine: nothing while the stream is half full, the intents
// stream named once it holds more than 80% of its limit.
func TestStreamFillingAlertFires(t *testing.T) {
	t.Parallel()
	fsys := loadFiles(t)
	expr := alertExpr(t, fsys, "JetinboxStreamFilling")
	job := scrapeJob(t, fsys, consumerTarget)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := testenv.NewNATS(t, testenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pipeline.Setup(ctx, js, pool, jsinbox.StreamConfig{MaxMsgs: 100}, 16); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.NewConsumer(reg)
	if err != nil {
		t.Fatal(err)
	}
	proc, _ := inbox.NewProcessor(pool, inbox.Config{Scope: "ledger", Handler: effects.NewLedger()})
	c, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{Durable: "ledger", Observer: m})
	if err != nil {
		t.Fatal(err)
	}
	m.Attach(c)
	cctx, ccancel := context.WithCancel(ctx)
	cdone := make(chan error, 1)
	go func() { cdone <- c.Run(cctx) }()
	defer func() {
		ccancel()
		if err := <-cdone; err != nil {
			t.Error(err)
		}
	}()
	page := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer page.Close()
	pub, _ := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	defer pub.Close()
	intents := pipeline.Generate(pipeline.Load{Count: 85, Accounts: 16, Prefix: "f"})
	publishSettled := func(some []jsinbox.Intent) {
		t.Helper()
		for _, in := range some {
			if err := pub.Publish(ctx, in); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := pipeline.WaitSettled(ctx, js, jsinbox.DefaultStream, "ledger", nil); err != nil {
			t.Fatal(err)
		}
	}

	publishSettled(intents[:50])
	if got := evalScraped(t, ctx, page.URL, job, consumerTarget, expr); len(got) != 0 {
		t.Fatalf("%s fires on a stream half full: %v", expr, got)
	}
	// Consumed or not, the messages stay until max_age: the stream fills.
	publishSettled(intents[50:])
	got := evalScraped(t, ctx, page.URL, job, consumerTarget, expr)
	if len(got) != 1 || got[0].Metric.Get("stream") != jsinbox.DefaultStream || got[0].Metric.Get("job") != job || got[0].F != 0.85 {
		t.Fatalf("%s with 85 of 100 messages: %v, want one sample {job=%q, stream=%q} 0.85", expr, got, job, jsinbox.DefaultStream)
	}
}
