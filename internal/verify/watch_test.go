package verify_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetinbox/jetinbox/internal/verify"
)

// TestWatchCheckpoint: a watch judges only settled messages, one round
// behind the ack floor; it keeps its checkpoint (the last sequence checked,
// the violations so far) in a file, a new watch on the same file goes on
// from there, and a watch of another scope refuses the file.
func TestWatchCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, pool := settledPipeline(t, 30)
	if _, err := pool.Exec(ctx, `DELETE FROM ledger_entries WHERE message_id = 'v-5'`); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	opts := verify.Options{Scope: "ledger", Durable: "ledger", Ledger: true}
	w, err := verify.NewWatch(js, pool, opts, path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := w.Register(reg); err != nil {
		t.Fatal(err)
	}
	// The first round only reads the ack floor.
	if r, err := w.Round(ctx); err != nil || r != nil {
		t.Fatalf("first round: %v, %+v", err, r)
	}
	r, err := w.Round(ctx)
	if err != nil || r == nil || r.StreamMessages != 30 || r.RowWithoutEffect != 1 || !r.Partial {
		t.Fatalf("second round: %v, %+v", err, r)
	}
	if r, err := w.Round(ctx); err != nil || r != nil {
		t.Fatalf("a round with nothing new: %v, %+v", err, r)
	}
	want := `# HELP jetinbox_verify_checked_messages_total Stream messages checked by jetinbox verify -watch.
# TYPE jetinbox_verify_checked_messages_total counter
jetinbox_verify_checked_messages_total 30
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), verify.MetricChecked); err != nil {
		t.Error(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if f.GetName() == verify.MetricViolations && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == verify.KindRowWithoutEffect {
				found = m.GetGauge().GetValue() == 1
			}
		}
	}
	if !found {
		t.Errorf("no %s{kind=%q} 1", verify.MetricViolations, verify.KindRowWithoutEffect)
	}
	if n, err := testutil.GatherAndCount(reg, verify.MetricViolations); err != nil || n != len(verify.ViolationKinds) {
		t.Errorf("%s series: %d, %v; want one per kind", verify.MetricViolations, n, err)
	}

	w2, err := verify.NewWatch(js, pool, opts, path)
	if err != nil {
		t.Fatal(err)
	}
	cp := w2.Checkpoint()
	if cp.Seq != 30 || cp.Checked != 30 || cp.Violations[verify.KindRowWithoutEffect] != 1 || len(cp.Examples) == 0 {
		t.Fatalf("checkpoint read back: %+v", cp)
	}
	other := opts
	other.Scope = "other"
	if _, err := verify.NewWatch(js, pool, other, path); err == nil || !strings.Contains(err.Error(), "scope") {
		t.Errorf("a watch of another scope took the checkpoint: %v", err)
	}
	if _, err := verify.NewWatch(js, pool, verify.Options{Scope: "ledger"}, ""); err == nil {
		t.Error("a watch without a durable: no error")
	}
}
