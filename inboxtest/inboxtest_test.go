package inboxtest_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inboxtest"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// effect writes the message's ID to a table, then fails as the payload
// says: "bad" is permanent, "fail" fails after the write.
func effect(payload []byte, write func() error) error {
	if string(payload) == "bad" {
		return inbox.Permanent(errors.New("bad input"))
	}
	if err := write(); err != nil {
		return err
	}
	if string(payload) == "fail" {
		return errors.New("transient")
	}
	return nil
}

// scenario runs every outcome through deliver and checks, with count,
// what the effect table holds afterwards.
func scenario(t *testing.T, deliver func(...inbox.Message) ([]inbox.Outcome, error), count func() int) {
	t.Helper()
	steps := []struct {
		msgs []inbox.Message
		want string
	}{
		{[]inbox.Message{inboxtest.Message("a", "ok"), inboxtest.Message("b", "ok")}, "applied applied"},
		{[]inbox.Message{inboxtest.Message("a", "ok")}, "duplicate"},
		{[]inbox.Message{inboxtest.Message("a", "other")}, "conflict"},
		{[]inbox.Message{inboxtest.Message("c", "bad")}, "rejected"},
		{[]inbox.Message{inboxtest.Message("d", "fail"), inboxtest.Message("e", "ok")}, "retry applied"},
		{[]inbox.Message{{ID: "bad id", Payload: []byte("ok")}}, "rejected"},
	}
	for i, s := range steps {
		out, err := deliver(s.msgs...)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := inboxtest.Statuses(out); got != s.want {
			t.Fatalf("step %d: %q, want %q (%+v)", i, got, s.want, out)
		}
	}
	// a, b and e applied once each; d's write rolled back with its claim.
	if n := count(); n != 3 {
		t.Fatalf("the effect table holds %d rows, want 3 (a failing effect must leave nothing)", n)
	}
	// d is retried: its claim was given back, so the next delivery applies it.
	m := inboxtest.Message("d", "ok")
	if out, err := deliver(m); err != nil || inboxtest.Statuses(out) != "applied" {
		t.Fatalf("redelivery of the retried message: %+v, %v", out, err)
	}
}

func TestSQLiteOutcomes(t *testing.T) {
	ctx := context.Background()
	h := inbox.HandlerFunc(func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		return effect(m.Payload, func() error {
			_, err := tx.ExecContext(ctx, `INSERT INTO done (id) VALUES (?)`, m.ID)
			return err
		})
	})
	kit, err := inboxtest.SQLite(h, inbox.Config{Scope: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer kit.Close()
	if _, err := kit.DB.ExecContext(ctx, `CREATE TABLE done (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	scenario(t, func(m ...inbox.Message) ([]inbox.Outcome, error) { return kit.Deliver(ctx, m...) }, func() int {
		var n int
		if err := kit.DB.QueryRowContext(ctx, `SELECT count(*) FROM done`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	})
}

// TestPostgresOutcomes: the PostgreSQL kit gives every test a schema of
// its own: the same scenario twice on one database sees only its own rows
// each time, and each schema is gone once its test ended.
func TestPostgresOutcomes(t *testing.T) {
	ctx := context.Background()
	url, err := testenv.SharedPostgres(t).CreateDatabase(ctx, strings.ToLower(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		return effect(m.Payload, func() error {
			_, err := tx.Exec(ctx, `INSERT INTO done (id) VALUES ($1)`, m.ID)
			return err
		})
	})
	var schemas []string
	for _, run := range []string{"first", "second"} {
		t.Run(run, func(t *testing.T) {
			kit := inboxtest.Postgres(t, url, h, inbox.Config{Scope: "test"})
			schemas = append(schemas, kit.Schema)
			if _, err := kit.Pool.Exec(ctx, `CREATE TABLE done (id text PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			scenario(t, func(m ...inbox.Message) ([]inbox.Outcome, error) { return kit.Deliver(ctx, m...) }, func() int {
				var n int
				if err := kit.Pool.QueryRow(ctx, `SELECT count(*) FROM done`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			})
		})
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1)`, schemas).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if len(schemas) != 2 || schemas[0] == schemas[1] || left != 0 {
		t.Fatalf("schemas %v, %d of them still there after their tests", schemas, left)
	}
}
