package app

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetinbox/jetinbox/delivery"
)

// leaseStore leases the rows it is given and records what it is told,
// failing the IDs in fail with ErrLeaseLost. The dead-letter counter's
// bookkeeping is all this tests: the dispatcher against PostgreSQL is
// tested in delivery/pgdelivery and by the deploy tests on the binary.
type leaseStore struct {
	rows map[string][]delivery.Delivery
	fail map[int64]bool
}

func (s *leaseStore) Lease(_ context.Context, _, endpoint string, _ int, _ time.Duration) ([]delivery.Delivery, error) {
	rows := s.rows[endpoint]
	s.rows[endpoint] = nil
	return rows, nil
}

func (s *leaseStore) Record(_ context.Context, _ string, id int64, _ delivery.Result) error {
	if s.fail[id] {
		return delivery.ErrLeaseLost
	}
	return nil
}

func TestDeadLetterCounted(t *testing.T) {
	t.Parallel()
	inner := &leaseStore{rows: map[string][]delivery.Delivery{"a": {{ID: 1}, {ID: 2}, {ID: 3}}, "b": {{ID: 4}, {ID: 5}}}, fail: map[int64]bool{5: true}}
	reg := prometheus.NewRegistry()
	st, err := deadLetterCounted(inner, reg, []delivery.Endpoint{{Name: "a"}, {Name: "b"}, {Name: "idle"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, e := range []string{"a", "b"} {
		if _, err := st.Lease(ctx, "me", e, 10, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for id, r := range map[int64]delivery.Result{
		1: {State: delivery.StateDead, Reason: "outcome unknown: reconcile: no answer known, and the receiver's key retention (24h0m0s) has passed"},
		2: {State: delivery.StateDead, Reason: "refused: 400 Bad Request"},
		3: {State: delivery.StatePending, Reason: "outcome unknown: 503 Service Unavailable"},
		4: {State: delivery.StateDead, Reason: `302 Found: redirect to "x" not followed`},
		5: {State: delivery.StateDead, Reason: "refused: 404 Not Found"}, // lease lost: not recorded
	} {
		err := st.Record(ctx, "me", id, r)
		if (id == 5) != errors.Is(err, delivery.ErrLeaseLost) {
			t.Fatalf("Record %d: %v", id, err)
		}
	}
	want := `
# HELP jetinbox_delivery_dead_letters_total x
# TYPE jetinbox_delivery_dead_letters_total counter
jetinbox_delivery_dead_letters_total{endpoint="a",reason="refused"} 1
jetinbox_delivery_dead_letters_total{endpoint="a",reason="unknown"} 1
jetinbox_delivery_dead_letters_total{endpoint="b",reason="refused"} 1
jetinbox_delivery_dead_letters_total{endpoint="b",reason="unknown"} 0
jetinbox_delivery_dead_letters_total{endpoint="idle",reason="refused"} 0
jetinbox_delivery_dead_letters_total{endpoint="idle",reason="unknown"} 0
`
	got, err := reg.Gather()
	if err != nil || len(got) != 1 {
		t.Fatalf("%v %v", got, err)
	}
	want = strings.Replace(want, "# HELP jetinbox_delivery_dead_letters_total x", "# HELP jetinbox_delivery_dead_letters_total "+got[0].GetHelp(), 1)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "jetinbox_delivery_dead_letters_total"); err != nil {
		t.Fatal(err)
	}
	if n := len(st.(*deadLetterStore).leased); n != 0 {
		t.Errorf("%d leased rows still remembered after their outcomes", n)
	}
}
