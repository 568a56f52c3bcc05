package verify_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/outbox"
)

// TestChainCountsEachCase: one parent per case of the chain check, planted
// by hand: a follow-up applied once, one published twice (after the
// duplicate window) and applied twice, one still pending in the outbox, one
// lost, one refused for good, and a follow-up nobody emitted.
func TestChainCountsEachCase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pipelinetest.New(t, jsinbox.StreamConfig{}, 4)
	if _, err := outbox.Migrate(ctx, e.Pool); err != nil {
		t.Fatal(err)
	}
	if _, err := jsinbox.EnsureStream(ctx, e.JS, jsinbox.StreamConfig{Name: "NOTIFICATIONS", Subjects: []string{"notifications.>"}, DuplicateWindow: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint) SELECT 'ledger', p, '\x00' FROM unnest(ARRAY['once', 'twice', 'waiting', 'gone', 'refused']) AS p;
INSERT INTO inbox (scope, message_id, fingerprint, status) VALUES ('ledger', 'rejected', '\x00', 'rejected');
INSERT INTO outbox (id, subject, payload, fingerprint) VALUES ('notify:waiting', 'notifications.1', '', '\x00'), ('notify:refused', 'notifications.1', '', '\x00');
UPDATE outbox SET failed = 'another stream' WHERE id = 'notify:refused';
INSERT INTO inbox (scope, message_id, fingerprint) SELECT 'notifications', p, '\x00' FROM unnest(ARRAY['notify:once', 'notify:twice']) AS p;
INSERT INTO ledger_entries (scope, message_id, account, amount) VALUES ('notifications', 'notify:once', 1, 1), ('notifications', 'notify:twice', 1, 1), ('notifications', 'notify:twice', 1, 1)`); err != nil {
		t.Fatal(err)
	}
	publish := func(id string) {
		t.Helper()
		if _, err := e.JS.PublishMsg(ctx, &nats.Msg{Subject: "notifications.1", Data: []byte("{}"), Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}); err != nil {
			t.Fatal(err)
		}
	}
	publish("notify:once")
	publish("notify:twice")
	publish("notify:ghost")
	time.Sleep(500 * time.Millisecond) // past the duplicate window: a second copy is stored
	publish("notify:twice")
	r, err := verify.Chain(ctx, e.JS, e.Pool, verify.ChainOptions{Stream: "NOTIFICATIONS", Scope: "notifications", Ledger: true})
	if err != nil {
		t.Fatal(err)
	}
	want := verify.ChainReport{Parents: 5, InStream: 3, Copies: 1, Pending: 1, Lost: 2, Unexpected: 1, NotApplied: 1, Duplicated: 1, AppliedOnce: 1}
	got := *r
	got.Examples, want.Examples = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("chain report %+v\nwant %+v\nexamples: %q", got, want, r.Examples)
	}
	if r.Clean() {
		t.Fatal("a chain with a lost, a duplicated and an unexpected follow-up is clean")
	}
}
