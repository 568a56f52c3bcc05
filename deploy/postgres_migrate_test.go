package deploy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/internal/pgmigrate"
)

// TestServiceRolesCannotHoldUpMigrate: under the shipped roles, the
// verifier holding the advisory lock number earlier releases migrated
// under, and the consumer and the relay in the middle of reading the
// migrations table, delay no `jetinbox migrate`. What a role that may read
// a table can still do, hold a read of it open while a migration alters
// it, ends the migration after the server's lock_timeout with an error that
// names that role, instead of a wait that also stalls the consumers behind
// it.
func TestServiceRolesCannotHoldUpMigrate(t *testing.T) {
	t.Parallel()
	dsns := provisionPostgres(t, fixture(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	open := func(role string) *pgx.Conn {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsns[role])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	verifier := open("jetinbox_verifier")
	if _, err := verifier.Exec(ctx, `SELECT pg_advisory_lock(7305924671)`); err != nil {
		t.Fatalf("the verifier takes the old migration lock: %v", err)
	}
	for _, role := range []string{"jetinbox_consumer", "jetinbox_relay"} {
		if _, err := open(role).Exec(ctx, `BEGIN; SELECT count(*) FROM jetinbox_migrations`); err != nil {
			t.Fatalf("%s reads jetinbox_migrations: %v", role, err)
		}
	}
	migrator, err := pgxpool.New(ctx, dsns["jetinbox_migrator"])
	if err != nil {
		t.Fatal(err)
	}
	defer migrator.Close()
	mctx, mcancel := context.WithTimeout(ctx, 20*time.Second)
	defer mcancel()
	for name, m := range map[string]func(context.Context, *pgxpool.Pool) (int, error){
		"inbox":  func(ctx context.Context, db *pgxpool.Pool) (int, error) { return pginbox.New(db).Migrate(ctx) },
		"ledger": func(ctx context.Context, db *pgxpool.Pool) (int, error) { return effects.Migrate(ctx, db) },
		"outbox": func(ctx context.Context, db *pgxpool.Pool) (int, error) { return pginbox.New(db).Outbox().Migrate(ctx) },
	} {
		if n, err := m(mctx, migrator); n != 0 || err != nil {
			t.Fatalf("migrate %s while the service roles hold the old lock and read the table = %d, %v", name, n, err)
		}
	}

	// A read of inbox held open by the verifier: a migration that alters
	// inbox waits for it, for the server's lock_timeout (10s in
	// postgresql.conf.snippet) at most.
	if _, err := verifier.Exec(ctx, `BEGIN; SELECT count(*) FROM inbox`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = pgmigrate.Apply(ctx, migrator, "deploytest", []migrate.Migration{{Version: 1, Name: "0001_alter.sql", SQL: `ALTER TABLE inbox ADD COLUMN deploytest int`}})
	t.Logf("migrate while the verifier reads inbox: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
	if !errors.Is(err, pgmigrate.ErrLockTimeout) || !strings.Contains(err.Error(), "role jetinbox_verifier") {
		t.Fatalf("migrate while the verifier holds a read of inbox: %v; want ErrLockTimeout naming jetinbox_verifier", err)
	}
	if waited := time.Since(start); waited > 30*time.Second {
		t.Errorf("migrate gave up after %v, want about lock_timeout", waited)
	}
}
