package deploy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// TestIntakeUnderItsRole runs the intake's work (a key claimed, its answer
// stored, an intent added to the outbox, in one transaction, and the reads
// of GET) as jetinbox_intake from postgres/intake.sql:
// it posts, replays, refuses a changed body and reads an intent's state,
// refused nothing; and the role may not delete a key, rewrite a stored
// key's scope, mark an outbox row or read the inbox. The maintainer prunes.
func TestIntakeUnderItsRole(t *testing.T) {
	t.Parallel()
	fx := fixture(t)
	pg := startPostgres(t, fx)
	pg.superuser(t, "postgres", "CREATE DATABASE jetinbox")
	pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
	dsn := func(role string) string {
		pw := strings.TrimPrefix(role, "jetinbox_") + "-pw"
		return fmt.Sprintf("postgres://%s:%s@localhost:%d/jetinbox?sslmode=verify-full&sslrootcert=%s", role, pw, pg.port, url.QueryEscape(pg.ca))
	}
	for _, role := range dbRoles {
		pg.superuser(t, "jetinbox", fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, strings.TrimPrefix(role, "jetinbox_")+"-pw"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	migrator, err := pgxpool.New(ctx, dsn("jetinbox_migrator"))
	if err != nil {
		t.Fatal(err)
	}
	defer migrator.Close()
	// What `jetinbox migrate` and `jetinbox intake -migrate` do.
	if _, err := pginbox.New(migrator).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := effects.Migrate(ctx, migrator); err != nil {
		t.Fatal(err)
	}
	if _, err := pginbox.New(migrator).Outbox().Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pgidempotency.New(migrator).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pg.as("jetinbox_migrator", "migrator-pw").mustFile(t, "postgres/grants.sql")
	pg.superuserFile(t, "jetinbox", "postgres/intake.sql")
	pg.superuserFile(t, "jetinbox", "postgres/intake.sql") // idempotent
	pg.superuser(t, "jetinbox", "ALTER ROLE jetinbox_intake PASSWORD 'intake-pw'")

	pool, err := pgxpool.New(ctx, dsn("jetinbox_intake"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pgidempotency.New(pool).CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema as jetinbox_intake: %v", err)
	}
	// The intake's work (internal/intake: the key claimed, the intent
	// added to the outbox under the scoped key's ID, one transaction),
	// without linking its SQLite store into this module.
	keys := pgidempotency.New(pool)
	h := idempotency.Wrap(keys, idempotency.Config{Principal: func(r *http.Request) (string, bool) {
		return "acme", r.Header.Get("Authorization") == "Bearer tok"
	}}, idempotency.Route{Name: "/v1/intents"}, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx, body []byte) error {
		key, _ := idempotency.ParseKey(r.Header.Get(idempotency.Header))
		sc := idempotency.Scope{Principal: "acme", Method: r.Method, Route: "/v1/intents", Key: key}
		if err := pgoutbox.Add(r.Context(), tx, inbox.Intent{ID: sc.ID(), Subject: "intents.1", Payload: body}); err != nil {
			return err
		}
		w.WriteHeader(http.StatusAccepted)
		return nil
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/intents", h)
	mux.HandleFunc("GET /v1/intents/{key}", func(w http.ResponseWriter, r *http.Request) {
		st, err := keys.Lookup(r.Context(), idempotency.Scope{Principal: "acme", Method: "POST", Route: "/v1/intents", Key: r.PathValue("key")})
		if err != nil || st == nil {
			http.Error(w, fmt.Sprint(err), http.StatusNotFound)
			return
		}
		var sent bool
		if err := pool.QueryRow(r.Context(), `SELECT sent_at IS NOT NULL FROM outbox WHERE id = $1`, idempotency.Scope{Principal: "acme", Method: "POST", Route: "/v1/intents", Key: r.PathValue("key")}.ID()).Scan(&sent); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func(body string) (int, bool) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/intents", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok")
		req.Header.Set(idempotency.Header, `"k-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get(idempotency.ReplayedHeader) == "true"
	}
	if code, _ := post(`{"subject":"intents.1","payload":{"account":1,"amount":5}}`); code != http.StatusAccepted {
		t.Fatalf("post as jetinbox_intake: %d", code)
	}
	if code, replayed := post(`{"subject":"intents.1","payload":{"account":1,"amount":5}}`); code != http.StatusAccepted || !replayed {
		t.Fatalf("retry as jetinbox_intake: %d replayed %v", code, replayed)
	}
	if code, _ := post(`{"subject":"intents.1","payload":{"account":1,"amount":6}}`); code != http.StatusUnprocessableEntity {
		t.Fatalf("another body as jetinbox_intake: %d", code)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/intents/k-1", nil)
	req.Header.Set("Authorization", "Bearer tok")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET as jetinbox_intake: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	as := pg.as("jetinbox_intake", "intake-pw")
	as.mustFail(t, "DELETE FROM idempotency_keys", "permission denied")
	as.mustFail(t, "UPDATE idempotency_keys SET principal = 'globex'", "permission denied")
	as.mustFail(t, "UPDATE idempotency_keys SET fingerprint = ''", "permission denied")
	as.mustFail(t, "UPDATE outbox SET sent_at = now()", "permission denied")
	as.mustFail(t, "DELETE FROM outbox", "permission denied")
	as.mustFail(t, "SELECT count(*) FROM inbox", "permission denied")
	as.mustFail(t, "SELECT count(*) FROM ledger_entries", "permission denied")
	as.mustFail(t, "TRUNCATE idempotency_keys", "permission denied")

	maint, err := pgxpool.New(ctx, dsn("jetinbox_maintainer"))
	if err != nil {
		t.Fatal(err)
	}
	defer maint.Close()
	if n, err := pgidempotency.New(maint).Prune(ctx, idempotency.PruneOptions{OlderThan: 25 * time.Hour}); err != nil || n != 0 {
		t.Fatalf("prune as jetinbox_maintainer: %d %v", n, err)
	}
}
