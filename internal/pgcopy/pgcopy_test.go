package pgcopy_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/internal/pgcopy"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestCopyRoundTrip(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE t (s text, b bytea, n bigint, z text)`); err != nil {
		t.Fatal(err)
	}
	w := pgcopy.New(4, 1, 8)
	for round := range 2 { // the second round reuses the buffer
		w.Reset(4)
		w.Row()
		w.Text("héllo")
		w.Bytea([]byte{0, 1, 255})
		w.Int8(-1 << 62)
		w.Null()
		w.Row()
		w.Text("")
		w.Bytea(nil)
		w.Int8(int64(round))
		w.Text("x")
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := w.CopyTo(ctx, tx, "t", "s, b, n, z"); err != nil || n != 2 {
			t.Fatalf("copy: %d, %v", n, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var got string
	if err := conn.QueryRow(ctx, `SELECT string_agg(format('%s|%s|%s|%s', s, encode(b, 'hex'), n, coalesce(z, 'NULL')), ';' ORDER BY n, s) FROM t`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	want := "héllo|0001ff|-4611686018427387904|NULL;héllo|0001ff|-4611686018427387904|NULL;||0|x;||1|x"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestCopyServerError(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE u (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	w := pgcopy.New(1, 2, 4)
	for _, id := range []string{"a", "a"} {
		w.Row()
		w.Text(id)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := w.CopyTo(ctx, tx, "u", "id"); err == nil || !strings.Contains(err.Error(), "23505") {
		t.Fatalf("duplicate key: %v", err)
	}
}

func TestFieldCountEnforced(t *testing.T) {
	for name, f := range map[string]func(w *pgcopy.Buffer){
		"missing":  func(w *pgcopy.Buffer) { w.Row(); w.Text("a"); w.Bytes() },
		"too many": func(w *pgcopy.Buffer) { w.Row(); w.Text("a"); w.Text("b"); w.Int8(1) },
		"next row": func(w *pgcopy.Buffer) { w.Row(); w.Row() },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f(pgcopy.New(2, 1, 1))
		})
	}
}
