// Package deliverytest is the conformance suite every delivery store runs
// (pgdelivery on PostgreSQL, sqlitedelivery on SQLite): a real dispatcher
// against real HTTP receivers (httptest) on the store's real database, so
// a store that differs in what it promises goes red in the same test.
package deliverytest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/internal/deliveryhook"
	"github.com/jetinbox/jetinbox/jitter"
)

// Store is what the suite uses of a store: the dispatcher's seam and the
// operator's reads and redrive.
type Store interface {
	delivery.Store
	List(ctx context.Context, state delivery.State, endpoint string, limit int) ([]delivery.Row, error)
	Redrive(ctx context.Context, endpoint string, ids []int64) (int64, error)
	Backlog(ctx context.Context) (int64, time.Duration, error)
}

// Env is one fresh, migrated database for one test.
type Env struct {
	// Store is a store on it.
	Store Store
	// Open returns another store on the same database through a handle
	// of its own (a second pool, a second connection to the file), as a
	// second dispatcher process would have.
	Open func(t *testing.T) Store
	// Add writes intents with the store's Add in one transaction, as an
	// effect does, and commits it unless Add failed.
	Add func(ctx context.Context, intents ...delivery.Intent) error
}

// Run runs every case of the suite as a parallel subtest; newEnv returns
// a fresh database per case. A store may instead run the cases one by one
// (each is exported) under test names of its own.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	tests := []struct {
		name string
		f    func(t *testing.T, e Env)
	}{
		{"Outcomes", Outcomes},
		{"RetentionEndsInReconcile", RetentionEndsInReconcile},
		{"RecordedOnlyAfterTheAnswer", RecordedOnlyAfterTheAnswer},
		{"KilledDispatcherRowComesBackWithItsKey", KilledDispatcherRowComesBackWithItsKey},
		{"LeasesAreExclusive", LeasesAreExclusive},
		{"LeaseLost", LeaseLost},
		{"AddBacklogAndRedrive", AddBacklogAndRedrive},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f(t, newEnv(t))
		})
	}
}

// add writes intents through e.Add, failing the test on an error.
func add(t *testing.T, e Env, in ...delivery.Intent) {
	t.Helper()
	if err := e.Add(context.Background(), in...); err != nil {
		t.Fatal(err)
	}
}

// intents returns n intents to endpoint, message IDs prefix-0 …
// prefix-(n-1).
func intents(endpoint, prefix string, n int) []delivery.Intent {
	out := make([]delivery.Intent, n)
	for i := range out {
		out[i] = delivery.Intent{Scope: "s", MessageID: fmt.Sprintf("%s-%d", prefix, i), Endpoint: endpoint, Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	return out
}

// Call is one request a receiver saw.
type Call struct {
	Key, ID, Sig, TS string
	Body             string
	At               time.Time
}

// Receiver is a test HTTP receiver that records every request and answers
// with answer(n, request), n counting from 1.
type Receiver struct {
	*httptest.Server
	mu    sync.Mutex
	calls []Call
}

// NewReceiver starts a receiver until the test ends.
func NewReceiver(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *Receiver {
	t.Helper()
	rc := &Receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 4096)
		n, _ := r.Body.Read(b)
		rc.mu.Lock()
		rc.calls = append(rc.calls, Call{Key: r.Header.Get("Idempotency-Key"), ID: r.Header.Get(delivery.HeaderID), Sig: r.Header.Get(delivery.HeaderSignature),
			TS: r.Header.Get(delivery.HeaderTimestamp), Body: string(b[:n]), At: time.Now()})
		k := len(rc.calls)
		rc.mu.Unlock()
		answer(k, w, r)
	}))
	t.Cleanup(rc.Close)
	return rc
}

// Seen returns the requests so far.
func (rc *Receiver) Seen() []Call {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]Call(nil), rc.calls...)
}

// Dispatch starts a dispatcher on st until the test ends, with short
// retry and idle waits unless cfg sets them.
func Dispatch(t *testing.T, st delivery.Store, cfg delivery.Config) *delivery.Dispatcher {
	t.Helper()
	if cfg.Retry.Base == 0 {
		cfg.Retry.Base, cfg.Retry.Cap = 20*time.Millisecond, 100*time.Millisecond
	}
	if cfg.Idle.Base == 0 {
		cfg.Idle.Base, cfg.Idle.Cap = 10*time.Millisecond, 50*time.Millisecond
	}
	d, err := delivery.NewDispatcher(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Error("dispatcher did not stop")
		}
	})
	return d
}

// WaitState polls until n rows of endpoint are in state (or a ceiling of
// two minutes), and returns them.
func WaitState(t *testing.T, st Store, endpoint string, state delivery.State, n int) []delivery.Row {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rows, err := st.List(context.Background(), state, endpoint, 100000)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) >= n {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d rows %s after 2 minutes, want %d", endpoint, len(rows), state, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Endpoint returns an endpoint with a 2 s timeout and an hour's key
// retention.
func Endpoint(name, url string) delivery.Endpoint {
	return delivery.Endpoint{Name: name, URL: url, Timeout: delivery.Duration(2 * time.Second), KeyRetention: delivery.Duration(time.Hour)}
}

func jitterFast() jitter.Policy {
	return jitter.Policy{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond}
}

// Outcomes: each status class ends where the package says: 2xx delivered, a
// permanent 4xx dead with its answer, 5xx/429 retried under the same key
// until delivered (a Retry-After honoured), every attempt signed and keyed
// alike, and a redriven dead row sent again with its key.
func Outcomes(t *testing.T, e Env) {
	ok := NewReceiver(t, func(int, http.ResponseWriter, *http.Request) {})
	bad := NewReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		w.Write([]byte(`{"error":"no such customer"}`))
	})
	flaky := NewReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		switch n {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	// 408, 409 and 425 are "not now" too: retried under the same key.
	notNow := NewReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		switch n {
		case 1:
			w.WriteHeader(http.StatusRequestTimeout)
		case 2:
			w.WriteHeader(http.StatusConflict)
		case 3:
			w.WriteHeader(http.StatusTooEarly)
		}
	})
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	eps := []delivery.Endpoint{Endpoint("ok", ok.URL), Endpoint("bad", bad.URL), Endpoint("flaky", flaky.URL), Endpoint("notnow", notNow.URL)}
	eps[0].SecretFiles = []string{secret}
	add(t, e, intents("ok", "m", 3)...)
	add(t, e, intents("bad", "m", 1)...)
	add(t, e, intents("flaky", "m", 1)...)
	add(t, e, intents("notnow", "m", 1)...)
	Dispatch(t, e.Store, delivery.Config{Endpoints: eps})

	WaitState(t, e.Store, "ok", delivery.StateDelivered, 3)
	for _, c := range ok.Seen() {
		if c.Key != `"`+c.ID+`"` || !strings.HasPrefix(c.ID, delivery.KeyPrefix) || !strings.HasPrefix(c.Sig, "v1,") || c.TS == "" {
			t.Errorf("headers: Idempotency-Key %s, webhook-id %s, signature %q, timestamp %q", c.Key, c.ID, c.Sig, c.TS)
		}
	}
	if n := len(ok.Seen()); n != 3 {
		t.Errorf("3 deliveries answered 2xx were sent %d times, want 3", n)
	}
	dead := WaitState(t, e.Store, "bad", delivery.StateDead, 1)
	if dead[0].LastStatus != 422 || string(dead[0].LastBody) != `{"error":"no such customer"}` || !strings.Contains(dead[0].Reason, "refused: 422") {
		t.Errorf("dead row: %d %q %q", dead[0].LastStatus, dead[0].LastBody, dead[0].Reason)
	}
	if n := len(bad.Seen()); n != 1 {
		t.Errorf("a permanent 4xx was sent %d times, want 1", n)
	}
	WaitState(t, e.Store, "flaky", delivery.StateDelivered, 1)
	fc := flaky.Seen()
	if len(fc) != 3 {
		t.Fatalf("flaky endpoint saw %d attempts, want 3 (503, 429, 200)", len(fc))
	}
	for _, c := range fc[1:] {
		if c.ID != fc[0].ID {
			t.Errorf("retry under a new key: %s then %s", fc[0].ID, c.ID)
		}
	}
	if gap := fc[2].At.Sub(fc[1].At); gap < 900*time.Millisecond {
		t.Errorf("Retry-After: 1 not honoured: next attempt after %v", gap)
	}
	WaitState(t, e.Store, "notnow", delivery.StateDelivered, 1)
	if nc := notNow.Seen(); len(nc) != 4 || nc[1].ID != nc[0].ID || nc[2].ID != nc[0].ID || nc[3].ID != nc[0].ID {
		t.Errorf("408, 409, 425 then 200: %d attempts %v, want 4 under one key", len(nc), nc)
	}

	// Redrive after a fix: pending again, sent with the same key.
	n, err := e.Store.Redrive(context.Background(), "bad", nil)
	if err != nil || n != 1 {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for len(bad.Seen()) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if bc := bad.Seen(); len(bc) < 2 || bc[1].ID != bc[0].ID {
		t.Errorf("redrive: %d calls, keys %v", len(bc), bc)
	}
}

// RetentionEndsInReconcile: past the key retention the row is dead-lettered "outcome unknown:
// reconcile", and every attempt before carried one key: never a new one.
// A receiver that times out is "unknown" too, retried under the same key.
func RetentionEndsInReconcile(t *testing.T, e Env) {
	down := NewReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	hung := NewReceiver(t, func(_ int, _ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	ep := Endpoint("down", down.URL)
	ep.KeyRetention = delivery.Duration(time.Second)
	slow := Endpoint("hung", hung.URL)
	slow.Timeout, slow.KeyRetention = delivery.Duration(200*time.Millisecond), delivery.Duration(time.Second)
	add(t, e, intents("down", "m", 1)...)
	add(t, e, intents("hung", "m", 1)...)
	Dispatch(t, e.Store, delivery.Config{Endpoints: []delivery.Endpoint{ep, slow}, Breaker: delivery.BreakerConfig{Failures: 1000}})
	for _, x := range []struct {
		name string
		rc   *Receiver
		ret  time.Duration
	}{{"down", down, time.Second}, {"hung", hung, time.Second}} {
		rows := WaitState(t, e.Store, x.name, delivery.StateDead, 1)
		if !strings.Contains(rows[0].Reason, "outcome unknown: reconcile") {
			t.Errorf("%s: reason %q", x.name, rows[0].Reason)
		}
		calls := x.rc.Seen()
		// A timed-out attempt may not have reached the receiver at all:
		// count the attempts the row recorded too.
		if len(calls) < 1 || rows[0].Attempts < 2 || (x.name == "down" && len(calls) < 2) {
			t.Fatalf("%s: %d attempts recorded, %d reached the receiver; want several", x.name, rows[0].Attempts, len(calls))
		}
		for _, c := range calls {
			if c.ID != calls[0].ID {
				t.Fatalf("%s: a retry used a new key: %s then %s", x.name, calls[0].ID, c.ID)
			}
		}
		if last := calls[len(calls)-1].At; last.Sub(calls[0].At) > x.ret {
			t.Errorf("%s: an attempt %v after the first, past the %v retention", x.name, last.Sub(calls[0].At), x.ret)
		}
	}
}

// RecordedOnlyAfterTheAnswer: the row stays pending while its call is in flight: the outcome is
// recorded only after the answer.
func RecordedOnlyAfterTheAnswer(t *testing.T, e Env) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	slow := NewReceiver(t, func(int, http.ResponseWriter, *http.Request) {
		select {
		case arrived <- struct{}{}:
		default: // a second call: never block the server's Close
		}
		<-release
	})
	add(t, e, intents("slow", "m", 1)...)
	Dispatch(t, e.Store, delivery.Config{Endpoints: []delivery.Endpoint{Endpoint("slow", slow.URL)}})
	select {
	case <-arrived:
	case <-time.After(2 * time.Minute):
		t.Fatal("no call")
	}
	time.Sleep(100 * time.Millisecond) // time for a wrong early mark to land
	rows, err := e.Store.List(context.Background(), delivery.StatePending, "slow", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Errorf("while the call is in flight: %d pending rows, want 1 (marked before the receiver answered)", len(rows))
	}
	close(release)
	WaitState(t, e.Store, "slow", delivery.StateDelivered, 1)
}

// KilledDispatcherRowComesBackWithItsKey: a dispatcher killed between the call and recording its outcome leaves
// the row leased; after the lease, another dispatcher (on a handle of its
// own) sends it again with the same key, and not before.
func KilledDispatcherRowComesBackWithItsKey(t *testing.T, e Env) {
	rc := NewReceiver(t, func(int, http.ResponseWriter, *http.Request) {})
	ep := Endpoint("r", rc.URL)
	ep.Timeout = delivery.Duration(200 * time.Millisecond)
	add(t, e, intents("r", "m", 1)...)
	const lease = 500 * time.Millisecond
	d, err := delivery.NewDispatcher(e.Store, delivery.Config{Endpoints: []delivery.Endpoint{ep}, Lease: lease, Idle: jitterFast()})
	if err != nil {
		t.Fatal(err)
	}
	deliveryhook.Attach(d, &deliveryhook.Faults{SkipRecord: func() bool { return true }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	deadline := time.Now().Add(2 * time.Minute)
	for len(rc.Seen()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	Dispatch(t, e.Open(t), delivery.Config{Endpoints: []delivery.Endpoint{ep}, Lease: lease})
	WaitState(t, e.Store, "r", delivery.StateDelivered, 1)
	calls := rc.Seen()
	if len(calls) != 2 || calls[1].ID != calls[0].ID {
		t.Fatalf("after the kill: %d calls %v; the row must be sent once more with its key", len(calls), calls)
	}
	// The lease began a moment before the first call: half of it is a
	// bound no scheduling delay reaches.
	if gap := calls[1].At.Sub(calls[0].At); gap < lease/2 {
		t.Errorf("sent again %v after the first call, inside the %v lease the killed dispatcher held", gap, lease)
	}
}

// LeasesAreExclusive: dispatchers on handles of their own lease from one database at once:
// every row is leased by exactly one of them, and with three dispatchers
// sending, the receiver sees each key once.
func LeasesAreExclusive(t *testing.T, e Env) {
	// Small counts: on SQLite each lease is a commit, and dispatchers on
	// one file take turns for the write lock.
	const n = 100
	add(t, e, intents("x", "m", n)...)
	stores := []Store{e.Store, e.Open(t), e.Open(t)}
	var mu sync.Mutex
	owner := map[int64]string{}
	var dup []string
	var wg sync.WaitGroup
	for i, st := range stores {
		for j := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				me := fmt.Sprintf("d%d.%d", i, j)
				// Bounded: a store that hands out leased rows again would
				// never run dry.
				empty := 0
				for round := 0; empty < 3 && round < n; round++ {
					rows, err := st.Lease(context.Background(), me, "x", 7, time.Hour)
					if err != nil {
						t.Error(err)
						return
					}
					if len(rows) == 0 {
						empty++
						continue
					}
					mu.Lock()
					for _, r := range rows {
						if o, ok := owner[r.ID]; ok {
							dup = append(dup, fmt.Sprintf("row %d leased by %s and %s", r.ID, o, me))
						}
						owner[r.ID] = me
					}
					stop := len(dup) > 0
					mu.Unlock()
					if stop {
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if len(dup) > 0 {
		t.Fatalf("%d rows leased twice while the first lease held, e.g. %s", len(dup), dup[0])
	}
	if len(owner) != n {
		t.Fatalf("%d of %d rows leased", len(owner), n)
	}

	// The same through dispatchers: each key reaches the receiver once.
	rc := NewReceiver(t, func(int, http.ResponseWriter, *http.Request) {})
	const m = 40
	add(t, e, intents("y", "m", m)...)
	for _, st := range stores {
		ep := Endpoint("y", rc.URL)
		ep.Concurrency = 4
		Dispatch(t, st, delivery.Config{Endpoints: []delivery.Endpoint{ep}})
	}
	WaitState(t, e.Store, "y", delivery.StateDelivered, m)
	seen := map[string]int{}
	for _, c := range rc.Seen() {
		seen[c.ID]++
	}
	for k, times := range seen {
		if times != 1 {
			t.Errorf("key %s sent %d times by three dispatchers, want once", k, times)
		}
	}
	if len(seen) != m {
		t.Errorf("%d keys reached the receiver, want %d", len(seen), m)
	}
}

// LeaseLost: a dispatcher records only a row it still holds: another owner's record
// is refused, and once a lease has run out and another dispatcher took the
// row, the first one's late record is refused too (ErrLeaseLost).
func LeaseLost(t *testing.T, e Env) {
	ctx := context.Background()
	// A live lease (an hour): nobody else leases or records the row.
	add(t, e, intents("live", "m", 1)...)
	held, err := e.Store.Lease(ctx, "a", "live", 10, time.Hour)
	if err != nil || len(held) != 1 {
		t.Fatalf("lease: %v, %v", held, err)
	}
	if held[0].Attempts != 1 || held[0].FirstAttempt.IsZero() || held[0].Key != delivery.Key("s", "m-0", "live") {
		t.Errorf("leased row: attempts %d, first attempt %v, key %s", held[0].Attempts, held[0].FirstAttempt, held[0].Key)
	}
	if again, err := e.Store.Lease(ctx, "b", "live", 10, time.Minute); err != nil || len(again) != 0 {
		t.Fatalf("a row under a live lease was leased again: %v, %v", again, err)
	}
	if err := e.Store.Record(ctx, "b", held[0].ID, delivery.Result{State: delivery.StateDelivered, Status: 200}); !errors.Is(err, delivery.ErrLeaseLost) {
		t.Fatalf("record by another owner: %v, want ErrLeaseLost", err)
	}
	// A lease that runs out: another dispatcher takes the row over.
	add(t, e, intents("z", "m", 1)...)
	rows, err := e.Store.Lease(ctx, "a", "z", 10, 200*time.Millisecond)
	if err != nil || len(rows) != 1 {
		t.Fatalf("lease: %v, %v", rows, err)
	}
	var taken []delivery.Delivery
	other := e.Open(t)
	deadline := time.Now().Add(2 * time.Minute)
	for len(taken) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		if taken, err = other.Lease(ctx, "b", "z", 10, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if len(taken) != 1 || taken[0].Attempts != 2 || taken[0].Key != rows[0].Key || !taken[0].FirstAttempt.Equal(rows[0].FirstAttempt) {
		t.Fatalf("after the lease ran out: %+v, want the row, attempt 2, same key and first attempt", taken)
	}
	if err := e.Store.Record(ctx, "a", rows[0].ID, delivery.Result{State: delivery.StateDelivered, Status: 200}); !errors.Is(err, delivery.ErrLeaseLost) {
		t.Fatalf("late record by the first owner: %v, want ErrLeaseLost", err)
	}
	if err := e.Store.Record(ctx, "b", rows[0].ID, delivery.Result{State: delivery.StatePending, Status: 503, Reason: "outcome unknown: 503", RetryIn: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if again, err := e.Store.Lease(ctx, "c", "z", 10, time.Minute); err != nil || len(again) != 0 {
		t.Fatalf("a row due in an hour was leased now: %v, %v", again, err)
	}
	pending := WaitState(t, e.Store, "z", delivery.StatePending, 1)
	if p := pending[0]; p.LastStatus != 503 || p.Reason != "outcome unknown: 503" || p.Attempts != 2 {
		t.Errorf("pending row: status %d, reason %q, attempts %d", p.LastStatus, p.Reason, p.Attempts)
	}
}

// AddBacklogAndRedrive: Add is idempotent per (scope, message ID, endpoint) and refuses bad
// input; the backlog counts pending rows and the oldest's age; redrive
// selects by ID and endpoint.
func AddBacklogAndRedrive(t *testing.T, e Env) {
	ctx := context.Background()
	if n, age, err := e.Store.Backlog(ctx); err != nil || n != 0 || age != 0 {
		t.Fatalf("empty backlog: %d, %v, %v", n, age, err)
	}
	add(t, e, intents("a", "m", 3)...)
	add(t, e, intents("a", "m", 3)...) // the same work again: no new rows
	add(t, e, intents("b", "m", 2)...)
	time.Sleep(20 * time.Millisecond)
	n, age, err := e.Store.Backlog(ctx)
	if err != nil || n != 5 || age < 10*time.Millisecond || age > time.Hour {
		t.Fatalf("backlog: %d, %v, %v; want 5 and the oldest's age", n, age, err)
	}
	for _, ep := range []string{"a", "b"} {
		rows, err := e.Store.Lease(ctx, "d", ep, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if err := e.Store.Record(ctx, "d", r.ID, delivery.Result{State: delivery.StateDead, Status: 400, Body: []byte("no"), Reason: "refused: 400"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, _, err := e.Store.Backlog(ctx); err != nil || n != 0 {
		t.Fatalf("backlog with every row dead: %d, %v", n, err)
	}
	dead, err := e.Store.List(ctx, delivery.StateDead, "", 100)
	if err != nil || len(dead) != 5 {
		t.Fatalf("dead rows: %d, %v", len(dead), err)
	}
	if d := dead[0]; d.LastStatus != 400 || string(d.LastBody) != "no" || d.Reason != "refused: 400" || d.LastAt.Before(d.Created) || d.Attempts != 1 {
		t.Errorf("dead row as listed: %+v", d)
	}
	n, err = e.Store.Redrive(ctx, "a", []int64{dead[0].ID, dead[4].ID})
	if err != nil || n != 1 {
		t.Fatalf("redrive endpoint a, one ID of a and one of b: %d, %v; want 1", n, err)
	}
	if n, err = e.Store.Redrive(ctx, "b", nil); err != nil || n != 2 {
		t.Fatalf("redrive endpoint b: %d, %v; want 2", n, err)
	}
	pending, err := e.Store.List(ctx, delivery.StatePending, "", 100)
	if err != nil || len(pending) != 3 {
		t.Fatalf("pending after redrive: %d, %v", len(pending), err)
	}
	ids := []int64{}
	for _, p := range pending {
		if p.Attempts != 0 || !p.FirstAttempt.IsZero() || p.Key != delivery.Key(p.Scope, p.MessageID, p.Endpoint) {
			t.Errorf("redriven row: attempts %d, first attempt %v, key %s", p.Attempts, p.FirstAttempt, p.Key)
		}
		ids = append(ids, p.ID)
	}
	if !slices.Contains(ids, dead[0].ID) {
		t.Errorf("redriven %v, want %d among them", ids, dead[0].ID)
	}
	if n, _, err := e.Store.Backlog(ctx); err != nil || n != 3 {
		t.Errorf("backlog after redrive: %d, %v", n, err)
	}
	bad := delivery.Intent{Scope: "s", MessageID: "m-new", Endpoint: "not a name!", Payload: []byte("{}")}
	if err := e.Add(ctx, intents("c", "m", 1)[0], bad); !errors.Is(err, delivery.ErrBadIntent) {
		t.Errorf("add with a bad endpoint name: %v, want ErrBadIntent", err)
	}
	if rows, err := e.Store.List(ctx, delivery.StatePending, "c", 10); err != nil || len(rows) != 0 {
		t.Errorf("a batch with a bad intent wrote %d rows (%v), want none", len(rows), err)
	}
}
