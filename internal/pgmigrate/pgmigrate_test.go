package pgmigrate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/internal/pgmigrate"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func states(t *testing.T, conn *pgx.Conn, ms []migrate.Migration) map[int]migrate.State {
	t.Helper()
	st, err := pgmigrate.Status(context.Background(), conn, "test", ms)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]migrate.State{}
	for _, s := range st {
		out[s.Version] = s
	}
	return out
}

// TestEditedFailedUnknown: an edited migration is an error, not skipped; a
// failed one leaves nothing behind and stays pending; versions the files do
// not know are reported; rows from before checksums get theirs.
func TestEditedFailedUnknown(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	ms := []migrate.Migration{
		{Version: 1, Name: "0001_a.sql", SQL: "CREATE TABLE a (id int)"},
		{Version: 2, Name: "0002_b.sql", SQL: "CREATE TABLE b (id int)"},
	}
	if st := states(t, conn, ms); !st[1].Pending || !st[2].Pending {
		t.Fatalf("never migrated: %+v", st)
	}
	if n, err := pgmigrate.Apply(ctx, conn, "test", ms); n != 2 || err != nil {
		t.Fatalf("Apply = %d, %v", n, err)
	}
	if n, err := pgmigrate.Apply(ctx, conn, "test", ms); n != 0 || err != nil {
		t.Fatalf("Apply again = %d, %v", n, err)
	}

	edited := []migrate.Migration{ms[0], {Version: 2, Name: "0002_b.sql", SQL: "CREATE TABLE b (id bigint)"}}
	if _, err := pgmigrate.Apply(ctx, conn, "test", edited); !errors.Is(err, migrate.ErrEdited) {
		t.Fatalf("Apply with an edited file: %v, want ErrEdited", err)
	}
	if st := states(t, conn, edited); !st[2].Edited || st[1].Edited {
		t.Fatalf("status with an edited file: %+v", st)
	}

	failing := append(ms, migrate.Migration{Version: 3, Name: "0003_c.sql", SQL: "CREATE TABLE c (id int); SELECT 1/0"})
	if _, err := pgmigrate.Apply(ctx, conn, "test", failing); err == nil {
		t.Fatal("a failing migration applied")
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('c') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("a failed migration left table c behind (%v)", err)
	}
	if st := states(t, conn, failing); !st[3].Pending {
		t.Fatalf("failed migration: %+v", st[3])
	}

	if st := states(t, conn, ms[:1]); !st[2].Unknown {
		t.Fatalf("version 2 unknown to files that stop at 1: %+v", st)
	}

	if _, err := conn.Exec(ctx, `UPDATE jetinbox_migrations SET checksum = NULL`); err != nil {
		t.Fatal(err)
	}
	if n, err := pgmigrate.Apply(ctx, conn, "test", ms); n != 0 || err != nil {
		t.Fatalf("Apply over rows without checksums = %d, %v", n, err)
	}
	if _, err := pgmigrate.Apply(ctx, conn, "test", edited); !errors.Is(err, migrate.ErrEdited) {
		t.Fatalf("checksums recorded from the files: %v, want ErrEdited for an edit after that", err)
	}

	// A table from before checksums were kept gets the column.
	if _, err := conn.Exec(ctx, `ALTER TABLE jetinbox_migrations DROP COLUMN checksum`); err != nil {
		t.Fatal(err)
	}
	if n, err := pgmigrate.Apply(ctx, conn, "test", ms); n != 0 || err != nil {
		t.Fatalf("Apply over a table without checksums = %d, %v", n, err)
	}
	if _, err := pgmigrate.Apply(ctx, conn, "test", edited); !errors.Is(err, migrate.ErrEdited) {
		t.Fatalf("checksum column added back: %v, want ErrEdited", err)
	}
}

var roleSeq atomic.Int64

// readerConn connects to dsn as a new login role that may only read
// jetinbox_migrations and the tables named, as the consumer, relay and
// verifier roles may.
func readerConn(t *testing.T, admin *pgx.Conn, dsn string, tables ...string) (*pgx.Conn, string) {
	t.Helper()
	ctx := context.Background()
	role := fmt.Sprintf("migrate_reader_%d_%d", roleSeq.Add(1), time.Now().UnixNano()%1e6)
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT ON ` + strings.Join(append([]string{"jetinbox_migrations"}, tables...), ", ") + ` TO ` + role,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User = role
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close(context.Background())
		_, _ = admin.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = admin.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
	})
	return conn, role
}

// TestReaderCannotDelayApply: a role that may only read the migrations
// table, holding the advisory lock number earlier versions migrated under
// and a transaction that read the table, delays no migration.
func TestReaderCannotDelayApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	ms := []migrate.Migration{{Version: 1, Name: "0001_a.sql", SQL: "CREATE TABLE a (id int)"}}
	if n, err := pgmigrate.Apply(ctx, admin, "test", ms); n != 1 || err != nil {
		t.Fatalf("Apply = %d, %v", n, err)
	}

	reader, _ := readerConn(t, admin, dsn)
	if _, err := reader.Exec(ctx, `SELECT pg_advisory_lock(7305924671)`); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Exec(ctx, `BEGIN; SELECT count(*) FROM jetinbox_migrations`); err != nil {
		t.Fatal(err)
	}
	defer reader.Exec(context.Background(), `ROLLBACK`) //nolint:errcheck // the test's end

	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	more := append(ms, migrate.Migration{Version: 2, Name: "0002_b.sql", SQL: "CREATE TABLE b (id int)"})
	if n, err := pgmigrate.Apply(actx, admin, "test", more); n != 1 || err != nil {
		t.Fatalf("Apply while a reader holds the old advisory lock and reads the table = %d, %v", n, err)
	}
}

// TestLockWaitEndsNamingTheHolder: a session that holds a table a
// migration alters delays it at most lock_timeout (the connection's, or
// DefaultLockTimeout without one), and the error names that session.
func TestLockWaitEndsNamingTheHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	noDefault := `DO $$ BEGIN IF current_setting('lock_timeout') = '0' THEN RAISE EXCEPTION 'migration runs without lock_timeout'; END IF; END $$`
	ms := []migrate.Migration{
		{Version: 1, Name: "0001_a.sql", SQL: "CREATE TABLE a (id int)"},
		{Version: 2, Name: "0002_check.sql", SQL: noDefault},
	}
	if n, err := pgmigrate.Apply(ctx, admin, "test", ms); n != 2 || err != nil {
		t.Fatalf("Apply = %d, %v", n, err)
	}

	reader, role := readerConn(t, admin, dsn, "a")
	if _, err := reader.Exec(ctx, `BEGIN; SELECT count(*) FROM a`); err != nil {
		t.Fatal(err)
	}
	defer reader.Exec(context.Background(), `ROLLBACK`) //nolint:errcheck // the test's end
	var pid int
	if err := reader.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["lock_timeout"] = "1500ms"
	short, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { short.Close(context.Background()) })
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	alter := append(ms, migrate.Migration{Version: 3, Name: "0003_alter.sql", SQL: "ALTER TABLE a ADD COLUMN b int"})
	n, err := pgmigrate.Apply(actx, short, "test", alter)
	if n != 0 || err == nil {
		t.Fatalf("Apply while a reader holds the table = %d, %v", n, err)
	}
	t.Logf("the error: %v", err)
	if waited := time.Since(start); waited > 10*time.Second {
		t.Errorf("Apply gave up after %v, want about the connection's lock_timeout, 1.5s", waited)
	}
	for _, want := range []string{role, fmt.Sprintf("pid %d", pid), "0003_alter.sql", "lock_timeout 1500ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	if !errors.Is(err, pgmigrate.ErrLockTimeout) {
		t.Errorf("the error does not wrap ErrLockTimeout: %v", err)
	}
	if st := states(t, short, alter); !st[3].Pending {
		t.Errorf("the migration that timed out: %+v, want pending", st[3])
	}
	// Once the reader is done, it applies.
	if _, err := reader.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	if n, err := pgmigrate.Apply(actx, short, "test", alter); n != 1 || err != nil {
		t.Fatalf("Apply after the reader let go = %d, %v", n, err)
	}
}

// TestConcurrentStarters: starters that migrate one fresh database at once
// take turns: the table is created once, each file applied once, nobody
// fails.
func TestConcurrentStarters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ms := []migrate.Migration{
		{Version: 1, Name: "0001_a.sql", SQL: "CREATE TABLE a (id int)"},
		{Version: 2, Name: "0002_b.sql", SQL: "ALTER TABLE a ADD COLUMN b int"},
		{Version: 3, Name: "0003_c.sql", SQL: "CREATE TABLE c (id int)"},
	}
	const starters = 6
	var wg sync.WaitGroup
	var applied atomic.Int64
	errs := make(chan error, starters)
	for range starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := pgmigrate.Apply(ctx, pool, "test", ms)
			applied.Add(int64(n))
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a concurrent starter failed: %v", err)
	}
	if applied.Load() != int64(len(ms)) {
		t.Errorf("%d migrations applied in all, want %d", applied.Load(), len(ms))
	}
}
