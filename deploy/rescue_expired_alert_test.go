package deploy_test

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/metrics"
)

// TestRescueExpiredAlertFires runs a consumer with its metrics on a stream
// whose max_age is short, and evaluates the JetinboxRescueExpired
// expression from alerts.yml with Prometheus's engine over two scrapes of
// its /metrics, as the consumer's job: nothing while intents are applied,
// the job named once a max-deliveries advisory names an intent that has
// aged out of the stream (the rescue records it as expired).
func TestRescueExpiredAlertFires(t *testing.T) {
	t.Parallel()
	fsys := loadFiles(t)
	expr := alertExpr(t, fsys, "JetinboxRescueExpired")
	job := scrapeJob(t, fsys, consumerTarget)

	reg := prometheus.NewRegistry()
	m, err := metrics.NewConsumer(reg)
	if err != nil {
		t.Fatal(err)
	}
	const maxAge = 2 * time.Second
	p := newAlertPipeline(t, jsinbox.StreamConfig{MaxAge: maxAge, DuplicateWindow: time.Second}, m)
	page := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer page.Close()

	before := scrapeSeries(t, page.URL, job, consumerTarget)
	p.publishSettled(t, pipeline.Generate(pipeline.Load{Count: 1, Accounts: 16, Prefix: "x"}))
	if got := evalScrapes(t, p.ctx, expr, before, scrapeSeries(t, page.URL, job, consumerTarget)); len(got) != 0 {
		t.Fatalf("%s fires on applied intents: %v", expr, got)
	}

	intents, err := p.js.Stream(p.ctx, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * maxAge); ; time.Sleep(50 * time.Millisecond) {
		if info, err := intents.Info(p.ctx); err == nil && info.State.Msgs == 0 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the intent did not age out of the stream (err %v)", err)
		}
	}
	// The advisory the server sends when it gives up on stream seq 1.
	advisory := fmt.Sprintf(`{"type":"io.nats.jetstream.advisory.v1.max_deliver","id":"a1","timestamp":"2026-01-01T00:00:00Z","stream":%q,"consumer":"ledger","stream_seq":1,"deliveries":20}`,
		jsinbox.DefaultStream)
	if _, err := p.js.Publish(p.ctx, "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+jsinbox.DefaultStream+".ledger", []byte(advisory)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); p.consumer.Stats().RescueExpired == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the rescue recorded nothing: %+v", p.consumer.Stats())
		}
	}
	got := evalScrapes(t, p.ctx, expr, before, scrapeSeries(t, page.URL, job, consumerTarget))
	if len(got) != 1 || got[0].Metric.Get("job") != job || got[0].F <= 0 {
		t.Fatalf("%s after an intent aged out before its rescue: %v, want one sample {job=%q}", expr, got, job)
	}
}
