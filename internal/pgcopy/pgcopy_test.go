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

// BenchmarkCopy compares the hand-written binary COPY buffer with pgx's
// CopyFrom (which caches the statement description since 5.12) on what
// the inbox writes per batch: 6,000 rows of scope, ID, fingerprint,
// sequence and subject, in a transaction rolled back each time.
//
//	go test -run '^$' -bench Copy -benchmem -count 5 ./internal/pgcopy
func BenchmarkCopy(b *testing.B) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDatabase(b))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE inbox_like (scope text, message_id text, fingerprint bytea, stream_seq bigint, subject text)`); err != nil {
		b.Fatal(err)
	}
	const n = 6000
	ids := make([]string, n)
	fps := make([][]byte, n)
	for i := range ids {
		ids[i] = "bench-" + strings.Repeat("x", 10) + string(rune('a'+i%26)) + strings.Repeat("0", i%7)
		fps[i] = make([]byte, 32)
		fps[i][0] = byte(i)
	}
	copyOnce := func(b *testing.B, f func(tx pgx.Tx) error) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := f(tx); err != nil {
			b.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("pgcopy", func(b *testing.B) {
		w := pgcopy.New(5, n, 96)
		b.ReportAllocs()
		for b.Loop() {
			copyOnce(b, func(tx pgx.Tx) error {
				w.Reset(5)
				for i := range n {
					w.Row()
					w.Text("ledger")
					w.Text(ids[i])
					w.Bytea(fps[i])
					w.Int8(int64(i))
					w.Text("intents.1")
				}
				_, err := w.CopyTo(ctx, tx, "inbox_like", "scope, message_id, fingerprint, stream_seq, subject")
				return err
			})
		}
	})
	b.Run("pgx.CopyFrom", func(b *testing.B) {
		cols := []string{"scope", "message_id", "fingerprint", "stream_seq", "subject"}
		b.ReportAllocs()
		for b.Loop() {
			copyOnce(b, func(tx pgx.Tx) error {
				_, err := tx.CopyFrom(ctx, pgx.Identifier{"inbox_like"}, cols, pgx.CopyFromFunc(func() func() ([]any, error) {
					i := 0
					row := make([]any, 5)
					return func() ([]any, error) {
						if i == n {
							return nil, nil
						}
						row[0], row[1], row[2], row[3], row[4] = "ledger", ids[i], fps[i], int64(i), "intents.1"
						i++
						return row, nil
					}
				}()))
				return err
			})
		}
	})
}
