package pgdelivery_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/internal/deliveryhook"
)

// Each status class ends where the package says: 2xx delivered, a
// permanent 4xx dead with its answer, 5xx/429 retried under the same key
// until delivered, and every attempt signed and keyed alike.
func TestOutcomes(t *testing.T) {
	st, pool := newStore(t)
	ok := newReceiver(t, func(int, http.ResponseWriter, *http.Request) {})
	bad := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		w.Write([]byte(`{"error":"no such customer"}`))
	})
	flaky := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		switch n {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600)
	eps := []delivery.Endpoint{endpoint("ok", ok.URL), endpoint("bad", bad.URL), endpoint("flaky", flaky.URL)}
	eps[0].SecretFiles = []string{secret}
	add(t, pool, "ok", "m", 3)
	add(t, pool, "bad", "m", 1)
	add(t, pool, "flaky", "m", 1)
	run(t, st, delivery.Config{Endpoints: eps})

	waitState(t, st, "ok", delivery.StateDelivered, 3)
	for _, c := range ok.seen() {
		if c.key != `"`+c.id+`"` || !strings.HasPrefix(c.id, delivery.KeyPrefix) || !strings.HasPrefix(c.sig, "v1,") || c.ts == "" {
			t.Errorf("headers: Idempotency-Key %s, webhook-id %s, signature %q, timestamp %q", c.key, c.id, c.sig, c.ts)
		}
	}
	dead := waitState(t, st, "bad", delivery.StateDead, 1)
	if dead[0].LastStatus != 422 || string(dead[0].LastBody) != `{"error":"no such customer"}` || !strings.Contains(dead[0].Reason, "refused: 422") {
		t.Errorf("dead row: %d %q %q", dead[0].LastStatus, dead[0].LastBody, dead[0].Reason)
	}
	if n := len(bad.seen()); n != 1 {
		t.Errorf("a permanent 4xx was sent %d times, want 1", n)
	}
	waitState(t, st, "flaky", delivery.StateDelivered, 1)
	fc := flaky.seen()
	if len(fc) != 3 {
		t.Fatalf("flaky endpoint saw %d attempts, want 3 (503, 429, 200)", len(fc))
	}
	for _, c := range fc[1:] {
		if c.id != fc[0].id {
			t.Errorf("retry under a new key: %s then %s", fc[0].id, c.id)
		}
	}
	if gap := fc[2].at.Sub(fc[1].at); gap < 900*time.Millisecond {
		t.Errorf("Retry-After: 1 not honoured: next attempt after %v", gap)
	}

	// Redrive after a fix: pending again, sent with the same key.
	n, err := st.Redrive(context.Background(), "bad", nil)
	if err != nil || n != 1 {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for len(bad.seen()) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if bc := bad.seen(); len(bc) < 2 || bc[1].id != bc[0].id {
		t.Errorf("redrive: %d calls, keys %v", len(bc), bc)
	}
}

// Past the key retention the row is dead-lettered "outcome unknown:
// reconcile", and every attempt before carried one key: never a new one.
func TestRetentionEndsInReconcile(t *testing.T) {
	st, pool := newStore(t)
	down := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	ep := endpoint("down", down.URL)
	ep.KeyRetention = delivery.Duration(400 * time.Millisecond)
	add(t, pool, "down", "m", 1)
	run(t, st, delivery.Config{Endpoints: []delivery.Endpoint{ep}, Breaker: delivery.BreakerConfig{Failures: 1000}})
	rows := waitState(t, st, "down", delivery.StateDead, 1)
	if !strings.Contains(rows[0].Reason, "outcome unknown: reconcile") {
		t.Errorf("reason %q", rows[0].Reason)
	}
	calls := down.seen()
	if len(calls) < 2 {
		t.Fatalf("%d attempts, want several", len(calls))
	}
	for _, c := range calls {
		if c.id != calls[0].id {
			t.Fatalf("a retry used a new key: %s then %s", calls[0].id, c.id)
		}
	}
	if last := calls[len(calls)-1].at; last.Sub(calls[0].at) > 400*time.Millisecond {
		t.Errorf("an attempt %v after the first, past the 400ms retention", last.Sub(calls[0].at))
	}
}

// The row stays pending while its call is in flight: the outcome is
// recorded only after the answer.
func TestRecordedOnlyAfterTheAnswer(t *testing.T) {
	st, pool := newStore(t)
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	slow := newReceiver(t, func(int, http.ResponseWriter, *http.Request) {
		arrived <- struct{}{}
		<-release
	})
	add(t, pool, "slow", "m", 1)
	run(t, st, delivery.Config{Endpoints: []delivery.Endpoint{endpoint("slow", slow.URL)}})
	select {
	case <-arrived:
	case <-time.After(2 * time.Minute):
		t.Fatal("no call")
	}
	time.Sleep(100 * time.Millisecond) // time for a wrong early mark to land
	rows, err := st.List(context.Background(), delivery.StatePending, "slow", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Errorf("while the call is in flight: %d pending rows, want 1 (marked before the receiver answered)", len(rows))
	}
	close(release)
	waitState(t, st, "slow", delivery.StateDelivered, 1)
}

// A dispatcher killed between the call and recording its outcome leaves
// the row leased; after the lease another dispatcher sends it again with
// the same key.
func TestKilledDispatcherRowComesBackWithItsKey(t *testing.T) {
	st, pool := newStore(t)
	rc := newReceiver(t, func(int, http.ResponseWriter, *http.Request) {})
	ep := endpoint("r", rc.URL)
	ep.Timeout = delivery.Duration(200 * time.Millisecond)
	add(t, pool, "r", "m", 1)
	d, err := delivery.NewDispatcher(st, delivery.Config{Endpoints: []delivery.Endpoint{ep}, Lease: 500 * time.Millisecond,
		Idle: jitterFast()})
	if err != nil {
		t.Fatal(err)
	}
	deliveryhook.Attach(d, &deliveryhook.Faults{SkipRecord: func() bool { return true }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	deadline := time.Now().Add(2 * time.Minute)
	for len(rc.seen()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	run(t, st, delivery.Config{Endpoints: []delivery.Endpoint{ep}, Lease: 500 * time.Millisecond})
	waitState(t, st, "r", delivery.StateDelivered, 1)
	calls := rc.seen()
	if len(calls) < 2 || calls[len(calls)-1].id != calls[0].id {
		t.Fatalf("after the kill: %d calls; the row must be sent again with its key", len(calls))
	}
}
