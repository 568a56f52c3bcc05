package pgidempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestAnswersRestOnConfirmedCommits: on a server that waits for a
// synchronous standby which never confirms, and whose waiting COMMITs are
// cancelled (PostgreSQL then answers success with a warning: committed on
// the primary only), the wrapper never answers 201 on such a commit, nor
// replays an answer stored by one: both are 503, outcome unknown, so the
// client retries with its key. A failover to the standby would otherwise
// lose what the client was told is done.
func TestAnswersRestOnConfirmedCommits(t *testing.T) {
	ctx := context.Background()
	srv := testenv.NewStandbyless(t)
	url, err := srv.CreateDatabase(ctx, "idem_sync")
	if err != nil {
		t.Fatal(err)
	}
	local, err := pgxpool.New(ctx, url+"&synchronous_commit=local")
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	if _, err := pgidempotency.New(local).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := local.Exec(ctx, `CREATE TABLE effects (what text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	pool, err := pginbox.NewPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	wrap := func(p *pgxpool.Pool) http.Handler {
		return idempotency.Wrap[pgx.Tx](pgidempotency.New(p), idempotency.Config{Principal: func(*http.Request) (string, bool) { return "acme", true }},
			idempotency.Route{Name: "/v1/things"}, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx, body []byte) error {
				if _, err := tx.Exec(r.Context(), `INSERT INTO effects VALUES ($1)`, string(body)); err != nil {
					return err
				}
				w.WriteHeader(http.StatusCreated)
				return nil
			})
	}
	post := func(h http.Handler, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/things", strings.NewReader("thing"))
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if err := srv.SetSynchronousStandby(ctx, testenv.AbsentStandby); err != nil {
		t.Fatal(err)
	}
	c, err := testenv.StartSyncRepCanceller(ctx, url, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = c.Stop() }()

	// A fresh request whose COMMIT's wait is cancelled.
	if rec := post(wrap(pool), "k-fresh"); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("fresh request on a commit the standby never confirmed: %d %s, want 503", rec.Code, rec.Body)
	}
	// An answer stored by a commit that did not wait (synchronous_commit
	// local, as a cancelled wait leaves it), replayed by a watched pool.
	if rec := post(wrap(local), "k-stored"); rec.Code != http.StatusCreated {
		t.Fatalf("first request without waiting: %d %s", rec.Code, rec.Body)
	}
	if rec := post(wrap(pool), "k-stored"); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("replay of an answer the standby may lack: %d (replayed %q), want 503", rec.Code, rec.Header().Get("Idempotent-Replayed"))
	}
	// Once nothing waits for the standby, the replay goes out.
	if _, err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := local.Exec(ctx, `ALTER SYSTEM RESET synchronous_standby_names`); err != nil {
		t.Fatal(err)
	}
	if _, err := local.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var names string
		if err := pool.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&names); err != nil {
			t.Fatal(err)
		}
		if names == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("synchronous_standby_names still %q after the reset", names)
		}
	}
	if rec := post(wrap(pool), "k-stored"); rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay once the standby is dropped: %d (replayed %q), want 201 replayed", rec.Code, rec.Header().Get("Idempotent-Replayed"))
	}
}
