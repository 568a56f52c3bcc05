package deploy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"

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
	m.Attach(p.consumer)
	page := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer page.Close()

	before := scrapeSeries(t, page.URL, job, consumerTarget)
	p.publishSettled(t, pipeline.Generate(pipeline.Load{Count: 1, Accounts: 16, Prefix: "x"}))
	if got := evalIncrease(t, p.ctx, before, scrapeSeries(t, page.URL, job, consumerTarget), expr); len(got) != 0 {
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
	got := evalIncrease(t, p.ctx, before, scrapeSeries(t, page.URL, job, consumerTarget), expr)
	if len(got) != 1 || got[0].Metric.Get("job") != job || got[0].F <= 0 {
		t.Fatalf("%s after an intent aged out before its rescue: %v, want one sample {job=%q}", expr, got, job)
	}
}

// scrapeSeries reads a /metrics page's counters and gauges as series
// selectors labelled with the job and instance Prometheus would add.
func scrapeSeries(t *testing.T, url, job, target string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(prommodel.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var v float64
			switch f.GetType() {
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			default:
				continue
			}
			ls := []string{fmt.Sprintf("job=%q", job), fmt.Sprintf("instance=%q", target)}
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out[fmt.Sprintf("%s{%s}", name, strings.Join(ls, ","))] = v
		}
	}
	return out
}

// evalIncrease evaluates expr a minute after the first scrape, with the
// second one a minute later: what an increase() or rate() sees between
// two scrapes.
func evalIncrease(t *testing.T, ctx context.Context, first, second map[string]float64, expr string) promql.Vector {
	t.Helper()
	var load strings.Builder
	load.WriteString("load 1m\n")
	for s, v := range second {
		fmt.Fprintf(&load, "  %s %v %v\n", s, first[s], v)
	}
	storage := promqltest.LoadedStorage(t, load.String())
	defer storage.Close()
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	q, err := engine.NewInstantQuery(ctx, storage, nil, expr, time.Unix(60, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	res := q.Exec(ctx)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		t.Fatal(err)
	}
	return vec
}
