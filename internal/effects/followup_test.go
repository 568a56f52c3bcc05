package effects

import (
	"context"
	"fmt"
	"testing"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// TestLedgerFollowUps: with follow-ups configured, every applied credit
// adds one outbox row in its transaction, with an ID derived from the
// message's, the same account and amount, and the message as parent; a
// rejected intent adds none, a redelivery adds none, a message that meets
// its follow-up ID already emitted with other contents is rejected and
// applies nothing. Without the configuration the ledger writes no outbox
// row (and needs no outbox table).
func TestLedgerFollowUps(t *testing.T) {
	ctx := context.Background()
	conn := ledgerDB(t, 8)
	if _, err := pginbox.New(conn).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	plain, err := inbox.NewProcessor(pginbox.New(conn), NewLedger(), inbox.Config{Scope: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	// Before the outbox table exists: the default ledger does not touch it.
	if out, err := plain.Process(ctx, []inbox.Message{{ID: "p-1", Payload: []byte(`{"account":1,"amount":5}`)}}); err != nil || out[0].Status != inbox.StatusApplied {
		t.Fatalf("plain ledger: %+v, %v", out, err)
	}
	if _, err := pgoutbox.New(conn).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := NewLedger().WithFollowUps(FollowUps{Subject: "notifications"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewLedger().WithFollowUps(FollowUps{Subject: "notifications.>"}); err == nil {
		t.Fatal("a wildcard subject prefix was accepted")
	}
	proc, err := inbox.NewProcessor(pginbox.New(conn), l, inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []inbox.Message
	for i := range 100 {
		msgs = append(msgs, inbox.Message{ID: fmt.Sprintf("m-%d", i), Payload: fmt.Appendf(nil, `{"account":%d,"amount":%d}`, 1+i%8, 10+i)})
	}
	msgs[7].Payload = []byte(`{"account":99,"amount":1}`) // unknown account: rejected
	msgs[9].Payload = []byte(`{"account":1`)              // bad input: rejected
	// Somebody emitted m-11's follow-up ID already, with other contents.
	if err := pgoutbox.Add(ctx, conn, inbox.Intent{ID: "notify:m-11", Subject: "notifications.4", Payload: []byte("other")}); err != nil {
		t.Fatal(err)
	}
	// The batch without m-11 first, so that no isolation of single messages
	// (which the conflict causes) hides a follow-up written for a rejected
	// neighbour; then the batch again with m-11, a redelivery of the rest.
	for pass := range 2 {
		batch := msgs
		if pass == 0 {
			batch = append(append([]inbox.Message(nil), msgs[:11]...), msgs[12:]...)
		}
		out, err := proc.Process(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			id := batch[i].ID
			want := inbox.StatusApplied
			if pass == 1 {
				want = inbox.StatusDuplicate
			}
			if id == "m-7" || id == "m-9" || id == "m-11" {
				want = inbox.StatusRejected
			}
			if o.Status != want {
				t.Fatalf("pass %d, %s: %v (%s), want %v", pass, id, o.Status, o.Reason, want)
			}
		}
	}
	var rows, wrong int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE id <> 'notify:' || parent_id OR subject <> 'notifications.' || (convert_from(payload, 'UTF8')::json->>'account')::int % 16)
FROM outbox WHERE id <> 'notify:m-11'`).Scan(&rows, &wrong); err != nil {
		t.Fatal(err)
	}
	if rows != 97 || wrong != 0 {
		t.Fatalf("%d follow-ups (%d malformed), want one per applied credit: 97", rows, wrong)
	}
	var entries int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE scope = 'ledger' AND message_id = 'm-11'`).Scan(&entries); err != nil || entries != 0 {
		t.Fatalf("m-11, whose follow-up conflicted, has %d ledger entries (%v), want 0", entries, err)
	}
	var payload string
	if err := conn.QueryRow(ctx, `SELECT convert_from(payload, 'UTF8') FROM outbox WHERE id = 'notify:m-3'`).Scan(&payload); err != nil || payload != `{"account":4,"amount":13}` {
		t.Fatalf("follow-up of m-3: %q, %v", payload, err)
	}
}
