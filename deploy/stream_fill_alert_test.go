package deploy_test

import (
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
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

	reg := prometheus.NewRegistry()
	m, err := metrics.NewConsumer(reg)
	if err != nil {
		t.Fatal(err)
	}
	p := newAlertPipeline(t, jsinbox.StreamConfig{MaxMsgs: 100}, m)
	page := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer page.Close()
	intents := pipeline.Generate(pipeline.Load{Count: 85, Accounts: 16, Prefix: "f"})

	p.publishSettled(t, intents[:50])
	if got := evalScraped(t, p.ctx, page.URL, job, consumerTarget, expr); len(got) != 0 {
		t.Fatalf("%s fires on a stream half full: %v", expr, got)
	}
	// Consumed or not, the messages stay until max_age: the stream fills.
	p.publishSettled(t, intents[50:])
	got := evalScraped(t, p.ctx, page.URL, job, consumerTarget, expr)
	if len(got) != 1 || got[0].Metric.Get("stream") != jsinbox.DefaultStream || got[0].Metric.Get("job") != job || got[0].F != 0.85 {
		t.Fatalf("%s with 85 of 100 messages: %v, want one sample {job=%q, stream=%q} 0.85", expr, got, job, jsinbox.DefaultStream)
	}
}
