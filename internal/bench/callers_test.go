package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestCallersPhase runs the callers phase small: both modes publish every
// intent, the steady-rate latencies are measured, and the output has the
// ratio.
func TestCallersPhase(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own servers")
	}
	o := Options{N: 400, Callers: 16, Rate: 200, Latency: 250 * time.Millisecond}
	r, err := callersPhase(context.Background(), o, func(string, ...any) {})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.modes) != 2 {
		t.Fatalf("%d modes, want group commit and one by one", len(r.modes))
	}
	for _, m := range r.modes {
		if m.rate <= 0 || len(m.lat) != 50 {
			t.Fatalf("%s: rate %v, %d latencies; want a rate and 50 latencies", m.name, m.rate, len(m.lat))
		}
	}
	if r.modes[1].batches != 0 {
		t.Fatalf("one by one published %d atomic batches", r.modes[1].batches)
	}
	var out bytes.Buffer
	r.write(&out)
	if !strings.Contains(out.String(), "group commit / one by one: ") {
		t.Fatalf("output lacks the ratio:\n%s", out.String())
	}
}
