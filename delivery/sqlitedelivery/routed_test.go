package sqlitedelivery_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/sqlitedelivery"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
)

// A routed effect adds one delivery per matched endpoint for the messages
// it applied, in the inbox transaction: none for a message the effect
// refused, none for another subject, none when the batch rolls back, and a
// redelivered message adds no second row.
func TestRoutedAddsDeliveriesInTheInboxTransaction(t *testing.T) {
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "inbox.db"))
	ib := sqliteinbox.New(db)
	if _, err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sqlitedelivery.New(db).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	effect := inbox.HandlerFunc(func(_ context.Context, _ *sql.Tx, m inbox.Message) error {
		switch {
		case string(m.Payload) == "refuse":
			return inbox.BadInput(errors.New("refused"))
		case string(m.Payload) == "fail":
			return errors.New("the effect failed: the batch rolls back")
		}
		return nil
	})
	routes := delivery.Routes{"orders.*": {"billing", "crm"}, "orders.created": {"billing"}}
	p, err := inbox.NewProcessor[*sql.Tx](ib, sqlitedelivery.Routed(effect, routes), inbox.Config{Scope: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []inbox.Message{
		{ID: "o-1", Subject: "orders.created", Payload: []byte(`{"o":1}`)},
		{ID: "o-2", Subject: "orders.created", Payload: []byte("refuse")},
		{ID: "o-3", Subject: "payments.done", Payload: []byte(`{"p":3}`)},
	}
	for range 2 { // the second time: a redelivery
		if _, err := p.Process(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	// A batch whose effect fails rolls back: it leaves no delivery behind.
	_, _ = p.Process(ctx, []inbox.Message{{ID: "o-4", Subject: "orders.paid", Payload: []byte("fail")}})
	want := []string{"orders/o-1/billing", "orders/o-1/crm"}
	if got := deliveries(t, db); !slices.Equal(got, want) {
		t.Fatalf("deliveries %v, want %v", got, want)
	}
}

func deliveries(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT scope || '/' || message_id || '/' || endpoint FROM deliveries ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	return got
}
