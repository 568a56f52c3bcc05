package console

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestOutgoingHop: an intent's timeline shows the calls its effect decided
// to make to other services, each with its stable key and where it stands
// (delivered, dead-lettered with why, pending), and the overview counts
// the backlog; a database without the deliveries table has none.
func TestOutgoingHop(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	registered := false
	for _, h := range DefaultHops() {
		registered = registered || h.Hop == "outgoing call"
	}
	if !registered {
		t.Fatal("the timeline's default hops do not read outgoing calls")
	}
	src := &Sources{Scope: "ledger", DBs: []SourceDB{{PG: pool}}}
	q := &Query{IDs: []string{"order-8812"}}
	if fs, err := outgoingHop(ctx, src, q); err != nil || len(fs) != 0 {
		t.Fatalf("without the deliveries table: %v, %v; want no facts and no error", fs, err)
	}
	if msg, err := deliveryBacklog(ctx, src); err != nil || msg != "" {
		t.Fatalf("backlog without the table: %q, %v", msg, err)
	}
	st := pgdelivery.New(pool)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgdelivery.Add(ctx, tx,
		delivery.Intent{Scope: "ledger", MessageID: "order-8812", Endpoint: "billing", Payload: []byte(`{}`)},
		delivery.Intent{Scope: "ledger", MessageID: "order-8812", Endpoint: "mailer", Payload: []byte(`{}`)},
		delivery.Intent{Scope: "ledger", MessageID: "order-9", Endpoint: "billing", Payload: []byte(`{}`)},
	); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	leased, err := st.Lease(ctx, "d1", "billing", 10, time.Minute)
	if err != nil || len(leased) != 2 {
		t.Fatalf("lease: %d rows, %v", len(leased), err)
	}
	for _, d := range leased {
		if d.MessageID == "order-8812" {
			if err := st.Record(ctx, "d1", d.ID, delivery.Result{State: delivery.StateDead, Status: 400, Reason: "refused: 400"}); err != nil {
				t.Fatal(err)
			}
		}
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
		"call to billing under Idempotency-Key " + delivery.Key("ledger", "order-8812", "billing") + ": dead-lettered after 1 attempt(s) because refused: 400, last answer 400",
		"call to mailer under Idempotency-Key " + delivery.Key("ledger", "order-8812", "mailer") + ": pending, 0 attempt(s) so far",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("timeline lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "order-9") {
		t.Errorf("another intent's delivery shown:\n%s", text)
	}
	if msg, err := deliveryBacklog(ctx, src); err != nil || !strings.HasPrefix(msg, "2 pending calls") {
		t.Errorf("backlog %q, %v; want 2 pending calls", msg, err)
	}
}
