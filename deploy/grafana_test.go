package deploy_test

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
)

var jetinboxMetrics = []string{
	"jetinbox_applied_total",
	"jetinbox_duplicates_total",
	"jetinbox_dead_letters_total",
	"jetinbox_redeliveries_total",
	"jetinbox_conflicts_total",
	"jetinbox_consumer_pending_messages",
	"jetinbox_consumer_ack_pending_messages",
	"jetinbox_verify_violations",
	"jetinbox_batch_duration_seconds",
	"jetinbox_publish_to_commit_seconds",
	"jetinbox_stream_fill_ratio",
}

// dashboard is the subset of Grafana's dashboard JSON model that
// jetinbox-dashboard.json uses, decoded strictly.
type dashboard struct {
	Title         string   `json:"title"`
	UID           string   `json:"uid"`
	Description   string   `json:"description"`
	Tags          []string `json:"tags"`
	Editable      bool     `json:"editable"`
	GraphTooltip  int      `json:"graphTooltip"`
	SchemaVersion int      `json:"schemaVersion"`
	Version       int      `json:"version"`
	Refresh       string   `json:"refresh"`
	Time          struct{ From, To string }
	Timezone      string               `json:"timezone"`
	Links         []any                `json:"links"`
	Annotations   struct{ List []any } `json:"annotations"`
	Templating    struct {
		List []struct {
			Name       string         `json:"name"`
			Label      string         `json:"label"`
			Type       string         `json:"type"`
			Query      any            `json:"query"`
			Datasource *dsRef         `json:"datasource,omitempty"`
			Definition string         `json:"definition,omitempty"`
			IncludeAll bool           `json:"includeAll,omitempty"`
			Multi      bool           `json:"multi,omitempty"`
			AllValue   string         `json:"allValue,omitempty"`
			Current    map[string]any `json:"current"`
			Hide       int            `json:"hide"`
			Refresh    int            `json:"refresh"`
			Sort       int            `json:"sort,omitempty"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int                      `json:"id"`
	Type        string                   `json:"type"`
	Title       string                   `json:"title"`
	Description string                   `json:"description,omitempty"`
	Collapsed   bool                     `json:"collapsed,omitempty"`
	Datasource  *dsRef                   `json:"datasource,omitempty"`
	GridPos     struct{ H, W, X, Y int } `json:"gridPos"`
	Targets     []struct {
		RefID        string `json:"refId"`
		Datasource   *dsRef `json:"datasource,omitempty"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets,omitempty"`
	FieldConfig map[string]any `json:"fieldConfig,omitempty"`
	Options     map[string]any `json:"options,omitempty"`
	Panels      []panel        `json:"panels,omitempty"`
}

// grafanaVars replaces Grafana's macros and variables with what PromQL accepts.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "6h", "$verify_job", ".*", "$deliver_job", ".*", "$job", ".*")

func validateDashboard(fsys files) error {
	b, err := fsys.get("grafana/jetinbox-dashboard.json")
	if err != nil {
		return err
	}
	var d dashboard
	if err := decodeStrict(b, &d); err != nil {
		return fmt.Errorf("grafana/jetinbox-dashboard.json: %w", err)
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("grafana/jetinbox-dashboard.json: "+format, args...))
		}
	}
	check(d.Title != "" && d.UID != "", "title and uid are required")
	check(d.SchemaVersion >= 36, "schemaVersion %d is older than Grafana 9", d.SchemaVersion)
	ids := map[int]bool{}
	covered := map[string]bool{}
	var byLayer bool
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			check(!ids[p.ID], "panel id %d used twice", p.ID)
			ids[p.ID] = true
			check(p.GridPos.W > 0 && p.GridPos.X+p.GridPos.W <= 24, "panel %q does not fit the 24-column grid", p.Title)
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			check(p.Title != "", "panel %d has no title", p.ID)
			check(len(p.Targets) > 0, "panel %q has no queries", p.Title)
			refs := map[string]bool{}
			for _, t := range p.Targets {
				check(!refs[t.RefID], "panel %q repeats refId %s", p.Title, t.RefID)
				refs[t.RefID] = true
				expr, err := promQL.ParseExpr(grafanaVars.Replace(t.Expr))
				if err != nil {
					check(false, "panel %q: %v", p.Title, err)
					continue
				}
				ms := metricsIn(expr)
				maps.Copy(covered, ms)
				// The verify metrics come from the verify service (jetinbox
				// verify -watch), whose job is not the consumer's.
				for m := range ms {
					if strings.HasPrefix(m, "jetinbox_verify_") {
						check(strings.Contains(t.Expr, `job=~"$verify_job"`) && !strings.Contains(t.Expr, "$job"),
							"panel %q: %s must select the verify service's job ($verify_job), not the consumer's: %s", p.Title, m, t.Expr)
					}
				}
				if ms["jetinbox_duplicates_total"] && strings.Contains(t.Expr, "by (layer)") {
					byLayer = true
				}
			}
		}
	}
	walk(d.Panels)
	verifyVar := false
	for _, v := range d.Templating.List {
		if v.Name == "verify_job" {
			verifyVar = v.Definition == "label_values(jetinbox_verify_violations, job)"
		}
	}
	check(verifyVar, "no variable verify_job from label_values(jetinbox_verify_violations, job)")
	for _, m := range jetinboxMetrics {
		check(covered[m], "no panel shows %s", m)
	}
	check(byLayer, "no panel shows jetinbox_duplicates_total by (layer)")
	return errors.Join(errs...)
}

func TestGrafanaDashboard(t *testing.T) {
	if err := validateDashboard(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}
