package verify_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/internal/verify"
)

// TestReportJSON: the JSON report says "clean" outright and carries the
// violation counts by kind, next to the report's own fields.
func TestReportJSON(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		r     verify.Report
		clean bool
		total int
	}{
		{verify.Report{StreamMessages: 3, AppliedOnce: 3}, true, 0},
		{verify.Report{StreamMessages: 3, Duplicated: 1, Lost: 2, BalanceMismatches: 1}, false, 4},
	} {
		b, err := json.Marshal(&tt.r)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Clean           *bool          `json:"clean"`
			Violations      map[string]int `json:"violations"`
			ViolationsTotal int            `json:"violations_total"`
			StreamMessages  int            `json:"stream_messages"`
			Duplicated      int            `json:"duplicated"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Clean == nil || *got.Clean != tt.clean || got.ViolationsTotal != tt.total ||
			got.StreamMessages != 3 || got.Duplicated != tt.r.Duplicated || len(got.Violations) != len(verify.ViolationKinds) ||
			got.Violations[verify.KindLost] != tt.r.Lost || got.Violations[verify.KindBalanceMismatch] != tt.r.BalanceMismatches {
			t.Errorf("JSON of %+v:\n%s", tt.r, b)
		}
		if !strings.HasPrefix(string(b), `{"clean":`) {
			t.Errorf("JSON does not start with clean: %s", b)
		}
	}
}

// TestReportRejectedReasonsSorted: the rejected reasons (and dead letters
// by status) are listed most first, then by text.
func TestReportRejectedReasonsSorted(t *testing.T) {
	t.Parallel()
	r := verify.Report{RejectedByReason: map[string]int{"poison: b": 2, "poison: a": 2, "effect: no account": 7, "z": 1},
		DeadByStatus: map[string]int{"conflict": 1, "rejected": 9}}
	var b strings.Builder
	r.WriteTable(&b)
	out := b.String()
	order := []string{"effect: no account", "poison: a", "poison: b", "  z"}
	last := -1
	for _, s := range order {
		i := strings.Index(out, s)
		if i <= last {
			t.Fatalf("rejected reasons not most first, then by text (%q at %d, after %d):\n%s", s, i, last, out)
		}
		last = i
	}
	if strings.Index(out, "rejected:") > strings.Index(out, "conflict:") {
		t.Errorf("dead letters by status not most first:\n%s", out)
	}
	got := r.RejectedReasons()
	if len(got) != 4 || got[0] != (verify.Count{Text: "effect: no account", N: 7}) || got[3].Text != "z" {
		t.Errorf("RejectedReasons = %v", got)
	}
}
