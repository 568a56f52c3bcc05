package metrics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetinbox/jetinbox/delivery"
)

// The dead-letter counter tells "outcome unknown: reconcile" from a
// refusal, by endpoint, and every endpoint's two series start at 0.
func TestDeliveryDeadLetters(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewDelivery(reg, func(context.Context) (int64, time.Duration, error) { return 0, 0, nil })
	if err != nil {
		t.Fatal(err)
	}
	m.StartSeries([]delivery.Endpoint{{Name: "a"}, {Name: "b"}, {Name: "idle"}})
	var o delivery.DeadObserver = m
	o.DeadLettered("a", true)
	o.DeadLettered("a", false)
	o.DeadLettered("b", false)
	want := `
# HELP jetinbox_delivery_dead_letters_total HELP
# TYPE jetinbox_delivery_dead_letters_total counter
jetinbox_delivery_dead_letters_total{endpoint="a",reason="refused"} 1
jetinbox_delivery_dead_letters_total{endpoint="a",reason="unknown"} 1
jetinbox_delivery_dead_letters_total{endpoint="b",reason="refused"} 1
jetinbox_delivery_dead_letters_total{endpoint="b",reason="unknown"} 0
jetinbox_delivery_dead_letters_total{endpoint="idle",reason="refused"} 0
jetinbox_delivery_dead_letters_total{endpoint="idle",reason="unknown"} 0
`
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "jetinbox_delivery_dead_letters_total" {
			want = strings.Replace(want, "HELP\n", mf.GetHelp()+"\n", 1)
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "jetinbox_delivery_dead_letters_total"); err != nil {
		t.Fatal(err)
	}
}
