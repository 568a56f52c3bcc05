package deploy_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
	promconfig "github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// TestVerifyAlertFiresOnAPlantedViolation runs the verifier as the verify
// service does (jetinbox verify -watch: rounds from a checkpoint up to the
// durable's settled messages) against real servers, scrapes its /metrics,
// labels the samples with the job prometheus.yml scrapes it as, and
// evaluates the JetinboxVerifyViolations expression from alerts.yml with
// Prometheus's own engine: nothing on a clean pipeline, the duplicated kind
// after a duplicated ledger entry is planted.
func TestVerifyAlertFiresOnAPlantedViolation(t *testing.T) {
	t.Parallel()
	fsys := loadFiles(t)
	expr := alertExpr(t, fsys, "JetinboxVerifyViolations")
	job := scrapeJob(t, fsys, verifyTarget)

	p := newAlertPipeline(t, jsinbox.StreamConfig{}, nil)
	ctx, js, pool := p.ctx, p.js, p.pool
	publishSettled := func(prefix string) {
		t.Helper()
		p.publishSettled(t, pipeline.Generate(pipeline.Load{Count: 40, Accounts: 16, Prefix: prefix}))
	}

	w, err := verify.NewWatch(js, pool, verify.Options{Scope: "ledger", Durable: "ledger", Ledger: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := w.Register(reg); err != nil {
		t.Fatal(err)
	}
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()
	// A round judges up to the ack floor the round before saw: two rounds
	// after the messages settled, they are judged.
	rounds := func() {
		t.Helper()
		for range 2 {
			if _, err := w.Round(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	publishSettled("a")
	rounds()
	if got := evalScraped(t, ctx, metrics.URL, job, verifyTarget, expr); len(got) != 0 {
		t.Fatalf("%s fires on a clean pipeline: %v", expr, got)
	}
	if cp := w.Checkpoint(); cp.Seq != 40 || cp.Checked != 40 {
		t.Fatalf("checkpoint after the first messages: %+v", cp)
	}

	publishSettled("b")
	if _, err := pool.Exec(ctx, `INSERT INTO ledger_entries (message_id, account, amount) SELECT message_id, account, amount FROM ledger_entries WHERE message_id = 'b-3'`); err != nil {
		t.Fatal(err)
	}
	rounds()
	got := evalScraped(t, ctx, metrics.URL, job, verifyTarget, expr)
	if len(got) != 1 || got[0].Metric.Get("kind") != verify.KindDuplicated || got[0].Metric.Get("job") != job || got[0].F != 1 {
		t.Fatalf("%s after a planted duplicate: %v, want one sample {job=%q, kind=%q} 1", expr, got, job, verify.KindDuplicated)
	}
}

// alertExpr returns the expression of the named alert in alerts.yml.
func alertExpr(t *testing.T, fsys files, name string) string {
	t.Helper()
	b, err := fsys.get("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(b, false, prommodel.UTF8Validation, promQL, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return r.Expr
			}
		}
	}
	t.Fatalf("alerts.yml has no alert %s", name)
	return ""
}

// scrapeJob returns the job prometheus.yml scrapes target in.
func scrapeJob(t *testing.T, fsys files, target string) string {
	t.Helper()
	b, err := fsys.get("prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := promconfig.Load(string(b), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range cfg.ScrapeConfigs {
		for _, c := range sc.ServiceDiscoveryConfigs {
			if st, ok := c.(discovery.StaticConfig); ok {
				for _, g := range st {
					if slices.ContainsFunc(g.Targets, func(ls prommodel.LabelSet) bool { return string(ls[prommodel.AddressLabel]) == target }) {
						return sc.JobName
					}
				}
			}
		}
	}
	t.Fatalf("prometheus.yml scrapes no %s", target)
	return ""
}

// evalScraped scrapes url once as Prometheus would (adding job and
// instance target), stores the samples and evaluates expr over them.
func evalScraped(t *testing.T, ctx context.Context, url, job, target, expr string) promql.Vector {
	t.Helper()
	return evalScrapes(t, ctx, expr, scrapeSeries(t, url, job, target))
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

// evalScrapes stores scrapes a minute apart and evaluates expr at the
// last: one scrape for a gauge's value, two for what an increase() or
// rate() sees between them. A series missing from an earlier scrape
// starts at 0 there.
func evalScrapes(t *testing.T, ctx context.Context, expr string, scrapes ...map[string]float64) promql.Vector {
	t.Helper()
	last := scrapes[len(scrapes)-1]
	var load strings.Builder
	load.WriteString("load 1m\n")
	for s := range last {
		fmt.Fprintf(&load, "  %s", s)
		for _, sc := range scrapes {
			fmt.Fprintf(&load, " %v", sc[s])
		}
		load.WriteString("\n")
	}
	storage := promqltest.LoadedStorage(t, load.String())
	defer storage.Close()
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	at := time.Unix(int64(60*(len(scrapes)-1)), 0)
	q, err := engine.NewInstantQuery(ctx, storage, nil, expr, at)
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
