package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"

	prommodel "github.com/prometheus/common/model"
	promconfig "github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// metricsIn returns the metric names an expression selects, with histogram
// suffixes folded to the histogram's name.
func metricsIn(expr parser.Expr) map[string]bool {
	out := map[string]bool{}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, suf := range []string{"_bucket", "_count", "_sum"} {
				name = strings.TrimSuffix(name, suf)
			}
			out[name] = true
		}
		return nil
	})
	return out
}

// numbersIn returns the number literals of an expression.
func numbersIn(expr parser.Expr) []float64 {
	var out []float64
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if nl, ok := n.(*parser.NumberLiteral); ok {
			out = append(out, nl.Val)
		}
		return nil
	})
	return out
}

var promQL = parser.NewParser(parser.Options{})

// verifyJob is the scrape job of the verify service (jetinbox verify
// -watch), and verifyTarget its address in the compose stack.
const (
	verifyJob    = "jetinbox-verify"
	verifyTarget = "verify:9091"
)

// selectsJob reports whether every selector of metric in expr matches
// job="job" exactly.
func selectsJob(expr parser.Expr, metric, job string) bool {
	found, all := false, true
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok || vs.Name != metric {
			return nil
		}
		found = true
		has := false
		for _, m := range vs.LabelMatchers {
			if m.Name == "job" && m.Type == labels.MatchEqual && m.Value == job {
				has = true
			}
		}
		all = all && has
		return nil
	})
	return found && all
}

func validateAlerts(fsys files) error {
	b, err := fsys.get("prometheus/alerts.yml")
	if err != nil {
		return err
	}
	groups, errs := rulefmt.Parse(b, false, prommodel.UTF8Validation, promQL, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		return fmt.Errorf("prometheus/alerts.yml: %w", errors.Join(errs...))
	}
	js, err := loadJetStream(fsys)
	if err != nil {
		return err
	}
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("prometheus/alerts.yml: "+format, args...))
		}
	}
	covered := map[string]bool{}
	var rules int
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			rules++
			check(r.Alert != "", "only alerting rules are expected, found record %q", r.Record)
			expr, err := promQL.ParseExpr(r.Expr)
			if err != nil {
				check(false, "%s: %v", r.Alert, err)
				continue
			}
			sev := r.Labels["severity"]
			check(sev == "warning" || sev == "critical", "%s: severity %q, want warning or critical", r.Alert, sev)
			check(r.Annotations["summary"] != "" && r.Annotations["description"] != "", "%s needs a summary and a description", r.Alert)
			ms := metricsIn(expr)
			maps.Copy(covered, ms)
			// Thresholds derived from the consumer definition.
			if ms["jetinbox_consumer_ack_pending_messages"] {
				want := 0.9 * float64(js.ledger.MaxAckPending)
				check(slices.Contains(numbersIn(expr), want), "%s: threshold should be 90%% of max_ack_pending (%v), found %v", r.Alert, want, numbersIn(expr))
			}
			// The verify metrics come from the verify service: the alert
			// selects its job and keeps the kind, so the page names it.
			if ms["jetinbox_verify_violations"] {
				check(selectsJob(expr, "jetinbox_verify_violations", verifyJob), "%s: must select jetinbox_verify_violations{job=%q}, the verify service's scrape job", r.Alert, verifyJob)
				check(strings.Contains(r.Expr, "by (job, kind)"), "%s: aggregate by (job, kind) so the alert names the kind", r.Alert)
			}
			if err := checkDeliverAlert(fsys, r.Alert, expr, ms); err != nil {
				errs = append(errs, err)
			}
			if ms["jetinbox_batch_duration_seconds"] {
				want := js.ledger.AckWait.Seconds() / 2
				check(slices.Contains(numbersIn(expr), want), "%s: threshold should be half of ack_wait (%vs), found %v", r.Alert, want, numbersIn(expr))
			}
		}
	}
	for _, m := range []string{"jetinbox_dead_letters_total", "jetinbox_redeliveries_total", "jetinbox_consumer_pending_messages", "jetinbox_consumer_ack_pending_messages", "jetinbox_verify_violations", "jetinbox_verify_last_run_timestamp_seconds", "jetinbox_conflicts_total", "jetinbox_stream_fill_ratio", "jetinbox_rescue_expired_total", "jetinbox_rescue_foreign_advisories_total", "jetinbox_rescue_backlog",
		"jetinbox_delivery_oldest_pending_seconds", "jetinbox_delivery_dead_letters_total", "jetinbox_delivery_attempts_total", "jetinbox_delivery_breaker_state"} {
		check(covered[m], "no alert uses %s", m)
	}
	check(rules > 0, "no rules")
	return errors.Join(errs...)
}

func TestAlertRules(t *testing.T) {
	if err := validateAlerts(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}

func validatePrometheusConfig(fsys files) error {
	b, err := fsys.get("prometheus/prometheus.yml")
	if err != nil {
		return err
	}
	cfg, err := promconfig.Load(string(b), slog.New(slog.DiscardHandler))
	if err != nil {
		return fmt.Errorf("prometheus/prometheus.yml: %w", err)
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("prometheus/prometheus.yml: "+format, args...))
		}
	}
	check(slices.Contains(cfg.RuleFiles, "/etc/prometheus/alerts.yml"), "rule_files must load /etc/prometheus/alerts.yml (where compose mounts alerts.yml)")
	jobs := map[string][]string{}
	for _, sc := range cfg.ScrapeConfigs {
		jobs[sc.JobName] = []string{}
		for _, c := range sc.ServiceDiscoveryConfigs {
			if st, ok := c.(discovery.StaticConfig); ok {
				for _, g := range st {
					for _, tg := range g.Targets {
						jobs[sc.JobName] = append(jobs[sc.JobName], string(tg[prommodel.AddressLabel]))
					}
				}
			}
		}
	}
	check(slices.Contains(jobs["jetinbox-consumer"], "consumer:8080"), "job jetinbox-consumer must scrape consumer:8080, has %v", jobs["jetinbox-consumer"])
	check(slices.Contains(jobs["jetinbox-relay"], "relay:9092"), "job jetinbox-relay must scrape relay:9092 (compose.yaml's relay -http), has %v", jobs["jetinbox-relay"])
	check(slices.Contains(jobs[verifyJob], verifyTarget), "job %s must scrape the verify service at %s, has %v", verifyJob, verifyTarget, jobs[verifyJob])
	check(slices.Contains(jobs[deliverJob], deliverTarget), "job %s must scrape the delivery dispatcher at %s (compose.yaml's deliver -http), has %v", deliverJob, deliverTarget, jobs[deliverJob])
	// The ConsumerDown alert matches this job name.
	alerts, _ := fsys.get("prometheus/alerts.yml")
	check(bytes.Contains(alerts, []byte(`up{job="jetinbox-consumer"}`)), "alerts.yml's up{} alert does not match the consumer job name")
	return errors.Join(errs...)
}

func TestPrometheusConfig(t *testing.T) {
	if err := validatePrometheusConfig(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}
