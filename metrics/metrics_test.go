package metrics

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

func TestConsumerMetricsLintAndCount(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewConsumer(reg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	m.ObserveBatch(jsinbox.BatchReport{
		Messages: []inbox.Message{{ID: "a", Published: now.Add(-30 * time.Millisecond)}, {ID: "b"}, {ID: "c"}, {ID: "d"}},
		Outcomes: []inbox.Outcome{
			{Status: inbox.StatusApplied},
			{Status: inbox.StatusRejected, Reason: "effects: bad intent: amount -5 must be positive"},
			{Status: inbox.StatusConflict},
			{Status: inbox.StatusRetry, Reason: "downstream busy"},
		},
		Began: now.Add(-5 * time.Millisecond), Ended: now,
	})
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
	}
	want := `
# HELP jetinbox_rejected_total Messages rejected by the inbox, by reason: bad_input, invalid_id, invalid_subject, claim_refused, panic, gave_up, permanent, conflict.
# TYPE jetinbox_rejected_total counter
jetinbox_rejected_total{reason="bad_input"} 1
jetinbox_rejected_total{reason="conflict"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "jetinbox_rejected_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.publishToCommit); n != 1 {
		t.Fatalf("publish_to_commit series: %d", n)
	}
}

func TestRejectReason(t *testing.T) {
	cases := map[string]inbox.Outcome{
		"conflict":        {Status: inbox.StatusConflict},
		"invalid_id":      {Status: inbox.StatusRejected, Err: inbox.Permanent(errors.Join(inbox.ErrInvalidID))},
		"invalid_subject": {Status: inbox.StatusRejected, Err: inbox.Permanent(fmt.Errorf("%w: NUL byte", inbox.ErrInvalidSubject))},
		"claim_refused":   {Status: inbox.StatusRejected, Err: inbox.Permanent(fmt.Errorf("%w: check", inbox.ErrClaimRefused))},
		"panic":           {Status: inbox.StatusRejected, Reason: "inbox: effect panicked: boom"},
		"gave_up":         {Status: inbox.StatusRejected, Reason: "gave up after 20 deliveries: x"},
		"bad_input":       {Status: inbox.StatusRejected, Reason: "effects: bad intent: x"},
		"permanent":       {Status: inbox.StatusRejected, Reason: "no such customer"},
	}
	for want, o := range cases {
		if got := RejectReason(o); got != want {
			t.Errorf("RejectReason(%+v) = %s, want %s", o, got, want)
		}
	}
}
