package pgidempotency_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/jitter"
)

// A chain of jetinbox services is once end to end: jetinbox's dispatcher
// calls a route of the idempotency middleware that verifies the Standard
// Webhooks signature and dedupes on webhook-id. The route's answers are
// lost on the way back (the effect committed, the caller saw 503), the
// dispatcher retries with the same key, and every call's effect is there
// once. A request signed with another secret is refused (401) and
// dead-lettered, nothing applied.
func TestWebhooksChainOnceEndToEnd(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	idem := pgidempotency.New(pool)
	dst := pgdelivery.New(pool)
	if _, err := idem.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (what text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	secret, _ := delivery.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	route := idempotency.Route{Name: "/hooks", Webhooks: &idempotency.Webhooks{Secrets: [][]byte{secret}}}
	cfg := idempotency.Config{Principal: func(*http.Request) (string, bool) { return "partner", true }, Logger: quiet()}
	h := idempotency.Wrap[pgx.Tx](idem, cfg, route, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx, body []byte) error {
		_, err := tx.Exec(r.Context(), `INSERT INTO effects VALUES ($1)`, string(body))
		return err
	})
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%2 == 1 { // every other answer is lost after the effect committed
			h.ServeHTTP(httptest.NewRecorder(), r)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()

	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	os.WriteFile(good, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), 0o600)
	os.WriteFile(bad, []byte("whsec_b3RoZXItc2VjcmV0LW90aGVyLXNlY3JldA=="), 0o600)
	eps := []delivery.Endpoint{
		{Name: "partner", URL: srv.URL + "/hooks", SecretFiles: []string{good}},
		{Name: "forged", URL: srv.URL + "/hooks", SecretFiles: []string{bad}},
	}
	const n = 20
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := "m-" + string(rune('a'+i))
		if err := pgdelivery.Add(ctx, tx, delivery.Intent{Scope: "s", MessageID: id, Endpoint: "partner", Payload: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgdelivery.Add(ctx, tx, delivery.Intent{Scope: "s", MessageID: "forged", Endpoint: "forged", Payload: []byte("forged")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := delivery.NewDispatcher(dst, delivery.Config{Endpoints: eps, Logger: quiet(),
		Retry: jitter.Policy{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond}, Idle: jitter.Policy{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(rctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		delivered, _ := dst.List(ctx, delivery.StateDelivered, "partner", 1000)
		dead, _ := dst.List(ctx, delivery.StateDead, "forged", 10)
		if len(delivered) == n && len(dead) == 1 {
			if dead[0].LastStatus != http.StatusUnauthorized || !strings.Contains(string(dead[0].LastBody), "signature") {
				t.Errorf("forged: %d %s", dead[0].LastStatus, dead[0].LastBody)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes: %d delivered, %d forged dead", len(delivered), len(dead))
		}
		time.Sleep(20 * time.Millisecond)
	}
	var total, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT what) FROM effects`).Scan(&total, &distinct); err != nil {
		t.Fatal(err)
	}
	if total != n || distinct != n {
		t.Errorf("effects: %d rows for %d calls (%d distinct), want each once; %d requests", total, n, distinct, calls.Load())
	}
	if calls.Load() < 2*n {
		t.Errorf("%d requests: the lost answers were not retried", calls.Load())
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
