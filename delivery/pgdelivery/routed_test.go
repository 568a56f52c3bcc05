package pgdelivery_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
)

// A routed effect adds one delivery per matched endpoint for the messages
// it applied, in the inbox transaction: none for a message the effect
// refused, none for another subject, and a redelivered message adds no
// second row.
func TestRoutedAddsDeliveriesInTheInboxTransaction(t *testing.T) {
	ctx := context.Background()
	st, pool := newStore(t)
	ib := pginbox.New(pool)
	if _, err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	effect := inbox.HandlerFunc(func(_ context.Context, _ pgx.Tx, m inbox.Message) error {
		if string(m.Payload) == "refuse" {
			return inbox.BadInput(errors.New("refused"))
		}
		return nil
	})
	routes := delivery.Routes{"orders.*": {"billing", "crm"}, "orders.created": {"billing"}}
	p, err := inbox.NewProcessor[pgx.Tx](ib, pgdelivery.Routed(effect, routes), inbox.Config{Scope: "orders"})
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
	var got []string
	rows, err := pool.Query(ctx, `SELECT scope || '/' || message_id || '/' || endpoint FROM deliveries ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"orders/o-1/billing", "orders/o-1/crm"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("deliveries %v, want %v", got, want)
	}
	_ = st
}
