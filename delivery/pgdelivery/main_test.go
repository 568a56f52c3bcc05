package pgdelivery_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newStore returns a migrated store on a fresh database.
func newStore(t *testing.T) (*pgdelivery.Store, *pgxpool.Pool) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st := pgdelivery.New(pool)
	if _, err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st, pool
}

// add commits n intents to endpoint in one transaction, message IDs
// prefix-0 … prefix-(n-1).
func add(t *testing.T, pool *pgxpool.Pool, endpoint, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	ins := make([]delivery.Intent, n)
	for i := range ins {
		ins[i] = delivery.Intent{Scope: "s", MessageID: prefix + "-" + itoa(i), Endpoint: endpoint, Payload: []byte(`{"n":` + itoa(i) + `}`)}
	}
	if err := pgdelivery.Add(ctx, tx, ins...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func itoa(i int) string { return string(appendInt(nil, i)) }

func appendInt(b []byte, i int) []byte {
	if i >= 10 {
		b = appendInt(b, i/10)
	}
	return append(b, byte('0'+i%10))
}

// call is one request a receiver saw.
type call struct {
	key, id, sig, ts string
	body             string
	at               time.Time
}

// receiver is a test HTTP receiver that records every request and answers
// with answer(n, request), n counting from 1.
type receiver struct {
	*httptest.Server
	mu    sync.Mutex
	calls []call
}

func newReceiver(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 4096)
		n, _ := r.Body.Read(b)
		rc.mu.Lock()
		rc.calls = append(rc.calls, call{key: r.Header.Get("Idempotency-Key"), id: r.Header.Get("webhook-id"), sig: r.Header.Get("webhook-signature"),
			ts: r.Header.Get("webhook-timestamp"), body: string(b[:n]), at: time.Now()})
		k := len(rc.calls)
		rc.mu.Unlock()
		answer(k, w, r)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) seen() []call {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]call(nil), rc.calls...)
}

// run starts a dispatcher until the test ends.
func run(t *testing.T, st delivery.Store, cfg delivery.Config) *delivery.Dispatcher {
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

// waitState polls until every row of endpoint is in state (or the
// ceiling), and returns the rows.
func waitState(t *testing.T, st *pgdelivery.Store, endpoint string, state delivery.State, n int) []delivery.Row {
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

func endpoint(name, url string) delivery.Endpoint {
	return delivery.Endpoint{Name: name, URL: url, Timeout: delivery.Duration(2 * time.Second), KeyRetention: delivery.Duration(time.Hour)}
}

type runtimeMem struct{ heap uint64 }

func (m *runtimeMem) read() {
	runtime.GC()
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.heap = s.HeapAlloc
}
