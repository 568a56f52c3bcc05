package console

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/sqlitedelivery"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
)

// TestOutgoingHopSQLite: on a SQLite file the timeline shows an intent's
// outgoing calls and the overview counts their backlog, as on PostgreSQL.
func TestOutgoingHopSQLite(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := sqliteinbox.Open(ctx, filepath.Join(t.TempDir(), "inbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	src := &Sources{Scope: "ledger", DBs: []SourceDB{{SQLite: db}}}
	q := &Query{IDs: []string{"order-8812"}}
	if fs, err := outgoingHop(ctx, src, q); err != nil || len(fs) != 0 {
		t.Fatalf("without the deliveries table: %v, %v; want no facts and no error", fs, err)
	}
	if msg, err := deliveryBacklog(ctx, src); err != nil || msg != "" {
		t.Fatalf("backlog without the table: %q, %v", msg, err)
	}
	st := sqlitedelivery.New(db)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sqlitedelivery.Add(ctx, tx,
		delivery.Intent{Scope: "ledger", MessageID: "order-8812", Endpoint: "billing", Payload: []byte(`{}`)},
		delivery.Intent{Scope: "ledger", MessageID: "order-8812", Endpoint: "mailer", Payload: []byte(`{}`)},
	); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	leased, err := st.Lease(ctx, "d1", "billing", 10, time.Minute)
	if err != nil || len(leased) != 1 {
		t.Fatalf("lease: %d rows, %v", len(leased), err)
	}
	if err := st.Record(ctx, "d1", leased[0].ID, delivery.Result{State: delivery.StateDelivered, Status: 200}); err != nil {
		t.Fatal(err)
	}
	fs, err := outgoingHop(ctx, src, q)
	if err != nil || len(fs) != 2 {
		t.Fatalf("facts %v, %v; want two", fs, err)
	}
	var all []string
	for _, f := range fs {
		all = append(all, f.What)
	}
	text := strings.Join(all, "\n")
	for _, want := range []string{
		"call to billing under Idempotency-Key " + delivery.Key("ledger", "order-8812", "billing") + ": delivered after 1 attempt(s), last answer 200",
		"call to mailer under Idempotency-Key " + delivery.Key("ledger", "order-8812", "mailer") + ": pending, 0 attempt(s) so far",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("timeline lacks %q:\n%s", want, text)
		}
	}
	if msg, err := deliveryBacklog(ctx, src); err != nil || !strings.HasPrefix(msg, "1 pending calls") {
		t.Errorf("backlog %q, %v; want 1 pending calls", msg, err)
	}
}
