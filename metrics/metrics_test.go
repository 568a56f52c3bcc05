package metrics

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inboxtest"
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
			{Status: inbox.StatusRejected, Cause: inbox.CauseBadInput, Reason: "effects: bad intent: amount -5 must be positive"},
			{Status: inbox.StatusConflict, Cause: inbox.CauseConflict},
			{Status: inbox.StatusRetry, Cause: inbox.CauseTransient, Reason: "downstream busy"},
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

// TestRejectReason: the label comes from the outcome's Cause, whatever its
// Reason says; every label value of jetinbox_rejected_total is reachable.
func TestRejectReason(t *testing.T) {
	cases := map[string]inbox.Outcome{
		"conflict":        {Status: inbox.StatusConflict, Cause: inbox.CauseConflict},
		"invalid_id":      {Status: inbox.StatusRejected, Cause: inbox.CauseInvalidID},
		"invalid_subject": {Status: inbox.StatusRejected, Cause: inbox.CauseInvalidSubject},
		"claim_refused":   {Status: inbox.StatusRejected, Cause: inbox.CauseClaimRefused},
		"panic":           {Status: inbox.StatusRejected, Cause: inbox.CausePanic},
		"gave_up":         {Status: inbox.StatusRejected, Cause: inbox.CauseGaveUp},
		"bad_input":       {Status: inbox.StatusRejected, Cause: inbox.CauseBadInput},
		"permanent":       {Status: inbox.StatusRejected, Cause: inbox.CausePermanent},
	}
	// Reasons that used to decide the label, each put on another cause.
	misleading := []string{"", "inbox: effect panicked: boom", "gave up after 20 deliveries: x", "effects: bad intent: x", "no such customer"}
	for want, o := range cases {
		for _, reason := range misleading {
			o.Reason = reason
			if got := RejectReason(o); got != want {
				t.Errorf("RejectReason(%v, reason %q) = %s, want %s", o.Cause, reason, got, want)
			}
		}
	}
	// A conflict is a conflict even from an outcome built without a cause.
	if got := RejectReason(inbox.Outcome{Status: inbox.StatusConflict}); got != "conflict" {
		t.Errorf("RejectReason(conflict without cause) = %s", got)
	}
}

// TestLabelsComeFromCause: rejections and retries are counted under the
// label of their Cause, not of their Reason or the batch's error.
func TestLabelsComeFromCause(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewConsumer(reg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	m.ObserveBatch(jsinbox.BatchReport{
		Messages: make([]inbox.Message, 5),
		Outcomes: []inbox.Outcome{
			{Status: inbox.StatusRejected, Cause: inbox.CausePanic, Reason: "effects: bad intent: looks like bad input"},
			{Status: inbox.StatusRejected, Cause: inbox.CauseBadInput, Reason: "gave up after 3 deliveries: looks like a give-up"},
			{Status: inbox.StatusRejected, Cause: inbox.CauseRejectedBefore, AlreadyInInbox: true, Reason: "counted when first rejected"},
			{Status: inbox.StatusRetry, Cause: inbox.CauseBatchFailed},
			{Status: inbox.StatusRetry, Cause: inbox.CauseTransient},
		},
		Began: now, Ended: now,
	})
	want := `
# HELP jetinbox_rejected_total Messages rejected by the inbox, by reason: bad_input, invalid_id, invalid_subject, claim_refused, panic, gave_up, permanent, conflict.
# TYPE jetinbox_rejected_total counter
jetinbox_rejected_total{reason="bad_input"} 1
jetinbox_rejected_total{reason="panic"} 1
# HELP jetinbox_retries_total Messages handed back for a later delivery with a jittered delay, by reason: transient (the effect asked for a retry) or batch_failed (database unreachable or commit outcome unknown).
# TYPE jetinbox_retries_total counter
jetinbox_retries_total{reason="batch_failed"} 1
jetinbox_retries_total{reason="transient"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "jetinbox_rejected_total", "jetinbox_retries_total"); err != nil {
		t.Fatal(err)
	}
}

// TestObserverIsAttachedByNewConsumer: the consumer's gauges read the
// consumer the metrics observe. Given as the consumer's Observer, the
// metrics are attached by NewConsumer: no second step that, left out,
// would leave the gauges silently empty.
func TestObserverIsAttachedByNewConsumer(t *testing.T) {
	kit, err := inboxtest.SQLite(inbox.HandlerFunc(func(context.Context, *sql.Tx, inbox.Message) error { return nil }), inbox.Config{Scope: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer kit.Close()
	m, err := NewConsumer(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c, err := jsinbox.NewConsumer(nil, kit.Processor(), jsinbox.ConsumerConfig{Observer: m})
	if err != nil {
		t.Fatal(err)
	}
	if m.c != c {
		t.Fatal("NewConsumer did not attach its Observer's gauges to the consumer")
	}
}
