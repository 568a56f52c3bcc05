package migrate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func states(t *testing.T, conn *pgx.Conn, ms []migrate.Migration) map[int]migrate.State {
	t.Helper()
	st, err := migrate.Status(context.Background(), conn, "test", ms)
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
	if n, err := migrate.Apply(ctx, conn, "test", ms); n != 2 || err != nil {
		t.Fatalf("Apply = %d, %v", n, err)
	}
	if n, err := migrate.Apply(ctx, conn, "test", ms); n != 0 || err != nil {
		t.Fatalf("Apply again = %d, %v", n, err)
	}

	edited := []migrate.Migration{ms[0], {Version: 2, Name: "0002_b.sql", SQL: "CREATE TABLE b (id bigint)"}}
	if _, err := migrate.Apply(ctx, conn, "test", edited); !errors.Is(err, migrate.ErrEdited) {
		t.Fatalf("Apply with an edited file: %v, want ErrEdited", err)
	}
	if st := states(t, conn, edited); !st[2].Edited || st[1].Edited {
		t.Fatalf("status with an edited file: %+v", st)
	}

	failing := append(ms, migrate.Migration{Version: 3, Name: "0003_c.sql", SQL: "CREATE TABLE c (id int); SELECT 1/0"})
	if _, err := migrate.Apply(ctx, conn, "test", failing); err == nil {
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
	if n, err := migrate.Apply(ctx, conn, "test", ms); n != 0 || err != nil {
		t.Fatalf("Apply over rows without checksums = %d, %v", n, err)
	}
	if _, err := migrate.Apply(ctx, conn, "test", edited); !errors.Is(err, migrate.ErrEdited) {
		t.Fatalf("checksums recorded from the files: %v, want ErrEdited for an edit after that", err)
	}
}
