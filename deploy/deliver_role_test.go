package deploy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
)

// TestDeliverUnderItsRole runs the last hop under postgres/deliver.sql's
// grants: the consumer adds a delivery in its transaction as
// jetinbox_consumer, the dispatcher leases, calls and records it as
// jetinbox_deliver, refused nothing; and jetinbox_deliver may not add or
// delete a delivery, rewrite its payload, or read the inbox or the outbox.
func TestDeliverUnderItsRole(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	migrator, err := pgxpool.New(ctx, dsn("jetinbox_migrator"))
	if err != nil {
		t.Fatal(err)
	}
	defer migrator.Close()
	// What `jetinbox migrate` does.
	if _, err := pginbox.New(migrator).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := effects.Migrate(ctx, migrator); err != nil {
		t.Fatal(err)
	}
	if _, err := pginbox.New(migrator).Outbox().Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pgdelivery.New(migrator).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pg.as("jetinbox_migrator", "migrator-pw").mustFile(t, "postgres/grants.sql")
	pg.superuserFile(t, "jetinbox", "postgres/deliver.sql")
	pg.superuserFile(t, "jetinbox", "postgres/deliver.sql") // idempotent
	pg.superuser(t, "jetinbox", "ALTER ROLE jetinbox_deliver PASSWORD 'deliver-pw'")

	consumer, err := pgxpool.New(ctx, dsn("jetinbox_consumer"))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	tx, err := consumer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in := delivery.Intent{Scope: "ledger", MessageID: "m-1", Endpoint: "partner", Payload: []byte(`{"n":1}`)}
	if err := pgdelivery.Add(ctx, tx, in, in); err != nil {
		t.Fatalf("Add as jetinbox_consumer: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pgdelivery.Add(ctx, consumer, in); err != nil {
		t.Fatalf("Add of a repeat as jetinbox_consumer: %v", err)
	}

	pool, err := pgxpool.New(ctx, dsn("jetinbox_deliver"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st := pgdelivery.New(pool)
	if err := st.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema as jetinbox_deliver: %v", err)
	}
	var got atomic.Int64
	rc := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { got.Add(1) }))
	defer rc.Close()
	d, err := delivery.NewDispatcher(st, delivery.Config{Endpoints: []delivery.Endpoint{{Name: "partner", URL: rc.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(rctx) }()
	for {
		rows, err := st.List(ctx, delivery.StateDelivered, "", 10)
		if err != nil {
			t.Fatalf("List as jetinbox_deliver: %v", err)
		}
		if len(rows) == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("not delivered under the role: %d calls, stats %+v", got.Load(), d.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	<-done
	if n, err := st.Redrive(ctx, "", nil); err != nil || n != 0 {
		t.Errorf("Redrive as jetinbox_deliver: %d, %v", n, err)
	}
	for _, q := range []string{
		`INSERT INTO deliveries (scope, message_id, endpoint, idem_key, payload) VALUES ('x', 'y', 'partner', 'k', '')`,
		`DELETE FROM deliveries`,
		`UPDATE deliveries SET payload = 'changed'`,
		`UPDATE deliveries SET endpoint = 'elsewhere'`,
		`SELECT count(*) FROM inbox`,
		`SELECT count(*) FROM outbox`,
	} {
		if _, err := pool.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("as jetinbox_deliver %q: %v, want permission denied", q, err)
		}
	}
	// The verifier (the console's reads) sees where deliveries stand and
	// the backlog, never a payload or an answer body, and changes nothing.
	verifier, err := pgxpool.New(ctx, dsn("jetinbox_verifier"))
	if err != nil {
		t.Fatal(err)
	}
	defer verifier.Close()
	if _, _, err := pgdelivery.New(verifier).Backlog(ctx); err != nil {
		t.Errorf("Backlog as jetinbox_verifier: %v", err)
	}
	if _, err := verifier.Exec(ctx, `SELECT endpoint, idem_key, state, attempts, last_status, reason, created_at, last_at FROM deliveries`); err != nil {
		t.Errorf("where deliveries stand, as jetinbox_verifier: %v", err)
	}
	for _, q := range []string{
		`SELECT payload FROM deliveries`,
		`SELECT last_body FROM deliveries`,
		`UPDATE deliveries SET state = 'dead'`,
		`DELETE FROM deliveries`,
	} {
		// The verifier's sessions are read-only too: a write may be
		// refused for that before its grants are looked at.
		if _, err := verifier.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "permission denied") && !strings.Contains(err.Error(), "read-only transaction") {
			t.Errorf("as jetinbox_verifier %q: %v, want permission denied", q, err)
		}
	}
	if _, err := verifier.Exec(ctx, `BEGIN READ WRITE; UPDATE deliveries SET state = 'dead'; COMMIT`); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("as jetinbox_verifier in a read-write transaction, an update: %v, want permission denied", err)
	}
}
