package deploy_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/jscheck"
)

type jsDefs struct {
	intents, dlq, advisories, notifications jetstream.StreamConfig
	ledger, rescue                          jetstream.ConsumerConfig
}

func loadJetStream(fsys files) (*jsDefs, error) {
	var d jsDefs
	for name, v := range map[string]any{
		"jetstream/intents-stream.json":         &d.intents,
		"jetstream/dlq-stream.json":             &d.dlq,
		"jetstream/advisories-stream.json":      &d.advisories,
		"jetstream/notifications-stream.json":   &d.notifications,
		"jetstream/ledger-consumer.json":        &d.ledger,
		"jetstream/ledger-rescue-consumer.json": &d.rescue,
	} {
		b, err := fsys.get(name)
		if err != nil {
			return nil, err
		}
		if err := decodeStrict(b, v); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return &d, nil
}

func checkStream(name string, c jetstream.StreamConfig, wantName, wantSubject string) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: "+format, append([]any{name}, args...)...))
		}
	}
	check(c.Name == wantName, "name %q, want %q", c.Name, wantName)
	check(slices.Equal(c.Subjects, []string{wantSubject}), "subjects %v, want [%s]", c.Subjects, wantSubject)
	check(c.Retention == jetstream.LimitsPolicy, "retention %v, want limits", c.Retention)
	check(c.Storage == jetstream.FileStorage, "storage %v, want file", c.Storage)
	check(c.Replicas == 3, "num_replicas %d, want 3", c.Replicas)
	// DiscardOld would delete unconsumed intents when the stream is full.
	check(c.Discard == jetstream.DiscardNew, "discard %v, want new", c.Discard)
	check(c.MaxMsgs > 0, "max_msgs must be an explicit limit, is %d", c.MaxMsgs)
	check(c.MaxBytes > 0, "max_bytes must be an explicit limit, is %d", c.MaxBytes)
	check(c.MaxAge > 0, "max_age must be an explicit limit, is %v", c.MaxAge)
	check(c.MaxMsgSize > 0 && c.MaxMsgSize <= 64<<10, "max_msg_size %d, want (0, 64KiB]: a consumer holds thousands of them", c.MaxMsgSize)
	check(c.Duplicates == 2*time.Minute, "duplicate_window %v, want 2m", c.Duplicates)
	check(c.DenyDelete, "deny_delete must be true")
	check(c.DenyPurge, "deny_purge must be true")
	check(!c.AllowRollup, "allow_rollup_hdrs must be false (a rollup deletes messages)")
	check(!c.AllowMsgTTL, "allow_msg_ttl must be false (a TTL deletes messages)")
	check(!c.NoAck, "no_ack must be false")
	check(!c.Sealed, "sealed must be false")
	check(c.PersistMode == jetstream.DefaultPersistMode, "persist_mode must be default (async acks before the write is stored)")
	check(c.Mirror == nil && len(c.Sources) == 0, "mirror/sources are not expected")
	// jetinbox verify reads with direct gets, so its NATS user needs no
	// permission that creates consumers (one that could rewrite the
	// production durable, or deliver a stream anywhere).
	check(c.AllowDirect, "allow_direct must be true: jetinbox verify reads the stream with direct gets")
	return errors.Join(errs...)
}

func validateJetStream(fsys files) error {
	d, err := loadJetStream(fsys)
	if err != nil {
		return err
	}
	errs := []error{
		checkStream("intents-stream.json", d.intents, "INTENTS", "intents.>"),
		checkStream("dlq-stream.json", d.dlq, "INTENTS_DLQ", "dlq.intents.>"),
		// The relay's target: what it publishes must stay (deny delete and
		// purge, discard new), and its rows are as small as intents.
		checkStream("notifications-stream.json", d.notifications, "NOTIFICATIONS", "notifications.>"),
	}
	if d.notifications.MaxMsgSize != d.intents.MaxMsgSize {
		errs = append(errs, fmt.Errorf("notifications-stream.json: max_msg_size %d, want the intents stream's %d", d.notifications.MaxMsgSize, d.intents.MaxMsgSize))
	}
	// The ledger's intents are at most 4 KiB: the stream takes what jsinbox
	// creates by default, and the dead letters that much plus their headers.
	if d.intents.MaxMsgSize != jsinbox.DefaultMaxMsgSize {
		errs = append(errs, fmt.Errorf("intents-stream.json: max_msg_size %d, want jsinbox's %d", d.intents.MaxMsgSize, jsinbox.DefaultMaxMsgSize))
	}
	for _, p := range jscheck.CheckDeadLetterFit(d.intents, d.dlq, 0) {
		errs = append(errs, fmt.Errorf("dlq-stream.json: %s", p))
	}
	c := d.ledger
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("ledger-consumer.json: "+format, args...))
		}
	}
	check(c.Durable == "ledger" && c.Name == "ledger", "durable_name/name %q/%q, want ledger", c.Durable, c.Name)
	check(c.DeliverSubject == "", "deliver_subject set: jetinbox uses a pull consumer")
	check(c.AckPolicy == jetstream.AckExplicitPolicy, "ack_policy %v, want explicit", c.AckPolicy)
	check(c.AckWait == 30*time.Second, "ack_wait %v, want 30s", c.AckWait)
	check(c.MaxDeliver > 0 && c.MaxDeliver == 20, "max_deliver %d, want 20 (finite)", c.MaxDeliver)
	check(c.MaxAckPending == 24000, "max_ack_pending %d, want 24000 (bounded; two replicas of 6000 × 2 in flight)", c.MaxAckPending)
	check(c.MaxWaiting == 64, "max_waiting %d, want 64", c.MaxWaiting)
	check(c.DeliverPolicy == jetstream.DeliverAllPolicy, "deliver_policy %v, want all", c.DeliverPolicy)
	check(c.FilterSubject == "intents.>" && len(c.FilterSubjects) == 0, "filter_subject %q, want intents.>", c.FilterSubject)
	check(c.InactiveThreshold == 0, "inactive_threshold set: a durable must never be removed for idling")
	check(c.Replicas == 0 || c.Replicas == 3, "num_replicas %d, want the stream's 3", c.Replicas)
	check(!c.MemoryStorage, "mem_storage must be false")
	check(len(c.BackOff) == 0, "backoff set: it does not apply to naks; the consumer computes its own jittered delays")
	errs = append(errs, checkAdvisories(d), checkRescue(d))
	return errors.Join(errs...)
}

// checkAdvisories compares advisories-stream.json with the stream jsinbox
// creates when it is missing (what the library's rescue relies on), for the
// deploy's intents stream.
func checkAdvisories(d *jsDefs) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("advisories-stream.json: "+format, args...))
		}
	}
	c := d.advisories
	want := jsinbox.StreamConfig{Name: d.intents.Name, Subjects: d.intents.Subjects, Replicas: d.intents.Replicas, MaxAge: d.intents.MaxAge}.AdvisoryConfig()
	check(c.Name == want.Name, "name %q, want %q", c.Name, want.Name)
	check(slices.Equal(c.Subjects, want.Subjects), "subjects %v, want %v: every max-deliveries advisory of the %s consumers", c.Subjects, want.Subjects, d.intents.Name)
	check(c.Retention == jetstream.LimitsPolicy, "retention %v, want limits", c.Retention)
	check(c.Storage == jetstream.FileStorage, "storage %v, want file: a restart would lose the advisories of messages to rescue", c.Storage)
	check(c.Replicas == d.intents.Replicas, "num_replicas %d, want the intents stream's %d", c.Replicas, d.intents.Replicas)
	check(c.Discard == want.Discard, "discard %v, want %v", c.Discard, want.Discard)
	check(c.MaxMsgs == want.MaxMsgs && c.MaxBytes == want.MaxBytes, "max_msgs/max_bytes %d/%d, want jsinbox's %d/%d", c.MaxMsgs, c.MaxBytes, want.MaxMsgs, want.MaxBytes)
	// A rescue needs the advisory, and records a message that aged out
	// first only if the advisory outlives it.
	check(c.MaxAge == want.MaxAge, "max_age %v, want the intents stream's %v plus %v", c.MaxAge, d.intents.MaxAge, jsinbox.AdvisoryOutlives)
	check(c.DenyDelete && c.DenyPurge, "deny_delete and deny_purge must be true: a deleted advisory is a message never rescued")
	check(!c.AllowRollup && !c.AllowMsgTTL, "allow_rollup_hdrs and allow_msg_ttl must be false")
	check(!c.NoAck && !c.Sealed, "no_ack and sealed must be false")
	check(c.PersistMode == jetstream.DefaultPersistMode, "persist_mode must be default")
	check(c.Mirror == nil && len(c.Sources) == 0, "mirror/sources are not expected")
	return errors.Join(errs...)
}

// maxDeliveriesSubject is the subject of a durable's max-deliveries
// advisories.
func maxDeliveriesSubject(stream, durable string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + durable
}

// checkRescue: ledger-rescue-consumer.json is the consumer jsinbox looks up
// (or creates) on the advisory stream for the ledger durable.
func checkRescue(d *jsDefs) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("ledger-rescue-consumer.json: "+format, args...))
		}
	}
	c := d.rescue
	check(c.Durable == d.ledger.Durable && c.Name == d.ledger.Durable, "durable_name/name %q/%q, want the intents durable's name %q", c.Durable, c.Name, d.ledger.Durable)
	want := maxDeliveriesSubject(d.intents.Name, d.ledger.Durable)
	check(c.FilterSubject == want && len(c.FilterSubjects) == 0, "filter_subject %q, want %q (its own durable's advisories only)", c.FilterSubject, want)
	check(c.DeliverSubject == "", "deliver_subject set: jsinbox pulls")
	check(c.DeliverPolicy == jetstream.DeliverAllPolicy, "deliver_policy %v, want all: advisories kept while no consumer ran are rescued too", c.DeliverPolicy)
	check(c.AckPolicy == jetstream.AckExplicitPolicy, "ack_policy %v, want explicit", c.AckPolicy)
	check(c.AckWait == d.ledger.AckWait, "ack_wait %v, want ledger-consumer.json's %v", c.AckWait, d.ledger.AckWait)
	check(c.MaxDeliver == -1, "max_deliver %d, want -1: a rescue that fails for a passing reason is tried again, never given up", c.MaxDeliver)
	check(c.MaxAckPending == jsinbox.RescueMaxAckPending, "max_ack_pending %d, want %d: room for a full rescue batch (jsinbox.RescueBatch) and the next pull", c.MaxAckPending, jsinbox.RescueMaxAckPending)
	check(c.InactiveThreshold == 0, "inactive_threshold set: a durable must never be removed for idling")
	check(c.Replicas == 0 || c.Replicas == d.advisories.Replicas, "num_replicas %d, want the stream's %d", c.Replicas, d.advisories.Replicas)
	check(!c.MemoryStorage, "mem_storage must be false")
	check(len(c.BackOff) == 0, "backoff set: the consumer computes its own jittered delays")
	return errors.Join(errs...)
}

func TestJetStreamDefinitions(t *testing.T) {
	if err := validateJetStream(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}
