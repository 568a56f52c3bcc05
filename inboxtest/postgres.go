package inboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
)

// PostgresKit is a [Kit] on a schema of its own in a PostgreSQL database,
// which the test's cleanup drops. [Postgres] makes one.
type PostgresKit struct {
	*Kit[pgx.Tx]
	// Pool is connected with the kit's schema as its search_path: create
	// the handler's tables with it (unqualified names land in the schema),
	// and read what the handler wrote.
	Pool *pgxpool.Pool
	// Schema is the name of the kit's schema.
	Schema string
}

// Postgres returns a kit running handler (written for pgx.Tx) on a new,
// migrated inbox in a schema of its own in the database at databaseURL (a
// test database; the role needs CREATE on it). Every call makes a new
// schema, so tests that run in parallel, and a second run of the same test,
// never see each other's rows; when t ends the pool is closed and the
// schema dropped with everything in it. Any error fails t at once.
func Postgres(t testing.TB, databaseURL string, handler inbox.Handler[pgx.Tx], cfg inbox.Config) *PostgresKit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b [8]byte
	_, _ = rand.Read(b[:])
	schema := "inboxtest_" + hex.EncodeToString(b[:])
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, databaseURL)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatalf("inboxtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, databaseURL)
		if err == nil {
			_, err = conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			_ = conn.Close(context.Background())
		}
		if err != nil {
			t.Errorf("inboxtest: drop schema %s: %v", schema, err)
		}
	})
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatalf("inboxtest: %v", err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	pginbox.WatchCommits(pcfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatalf("inboxtest: %v", err)
	}
	t.Cleanup(pool.Close) // before the schema is dropped
	k, err := New(pginbox.New(pool), handler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &PostgresKit{Kit: k, Pool: pool, Schema: schema}
}
