package pgdelivery_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/internal/deliverytest"
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

// batchFunc is a batch [inbox.Handler] of a function.
type batchFunc func(ctx context.Context, tx pgx.Tx, msgs []inbox.Message, errs []error) error

func (f batchFunc) Handle(ctx context.Context, tx pgx.Tx, msgs []inbox.Message, errs []error) error {
	return f(ctx, tx, msgs, errs)
}

// A delivery commits with its inbox row or not at all: when the inbox
// transaction fails after the routed effect added its deliveries, no
// delivery row is left and the receiver, with a dispatcher running all
// along, is not called; the redelivery that commits is called once.
func TestRoutedRollbackLeavesNoCall(t *testing.T) {
	ctx := context.Background()
	st, pool := newStore(t)
	ib := pginbox.New(pool)
	if _, err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rc := deliverytest.NewReceiver(t, func(int, http.ResponseWriter, *http.Request) {})
	deliverytest.Dispatch(t, st, delivery.Config{Endpoints: []delivery.Endpoint{deliverytest.Endpoint("billing", rc.URL)}})
	routed := pgdelivery.Routed(inbox.HandlerFunc(func(context.Context, pgx.Tx, inbox.Message) error { return nil }),
		delivery.Routes{"orders.*": {"billing"}})
	failing := true
	h := batchFunc(func(ctx context.Context, tx pgx.Tx, msgs []inbox.Message, errs []error) error {
		if err := routed.Handle(ctx, tx, msgs, errs); err != nil {
			return err
		}
		if !failing {
			return nil
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM deliveries`).Scan(&n); err != nil || n != 1 {
			t.Errorf("inside the transaction: %d delivery rows (%v), want 1", n, err)
		}
		// Long enough for a dispatcher that could see the row (it polls
		// every 10 to 50 ms) to call.
		time.Sleep(300 * time.Millisecond)
		return errors.New("the transaction fails after the effect")
	})
	p, err := inbox.NewProcessor[pgx.Tx](ib, h, inbox.Config{Scope: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []inbox.Message{{ID: "o-1", Subject: "orders.created", Payload: []byte(`{"o":1}`)}}
	out, err := p.Process(ctx, msgs)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM deliveries`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after the rollback: %d delivery rows (%v), want 0", n, err)
	}
	if calls := rc.Seen(); len(calls) != 0 {
		t.Fatalf("the receiver was called for a transaction that rolled back: %v", calls)
	}
	if err == nil && out[0].Ackable() {
		t.Fatalf("the failing transaction's message may be acked: %+v", out[0])
	}
	failing = false
	if out, err := p.Process(ctx, msgs); err != nil || !out[0].Ackable() {
		t.Fatalf("the redelivery: %+v, %v", out, err)
	}
	deliverytest.WaitState(t, st, "billing", delivery.StateDelivered, 1)
	if calls := rc.Seen(); len(calls) != 1 {
		t.Fatalf("the receiver was called %d times, want once: %v", len(calls), calls)
	}
}
