package pgidempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/internal/idemtest"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.MainNoLeaks(m) }

func open(t testing.TB) idemtest.DB[pgx.Tx] {
	ctx := context.Background()
	url := testenv.NewDatabase(t)
	newPool := func() *pgxpool.Pool {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	pool := newPool()
	st := pgidempotency.New(pool)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (what text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return idemtest.DB[pgx.Tx]{
		Store: func() idempotency.Store[pgx.Tx] { return pgidempotency.New(newPool()) },
		Effect: func(ctx context.Context, tx pgx.Tx, what string) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, what)
			return err
		},
		Effects: func(ctx context.Context) (map[string]int, error) {
			rows, err := pool.Query(ctx, `SELECT what, count(*)::int FROM effects GROUP BY what`)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			m := map[string]int{}
			for rows.Next() {
				var w string
				var n int
				if err := rows.Scan(&w, &n); err != nil {
					return nil, err
				}
				m[w] = n
			}
			return m, rows.Err()
		},
		Age: func(ctx context.Context, d time.Duration) error {
			_, err := pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = created_at - $1::bigint * interval '1 microsecond'`, d.Microseconds())
			return err
		},
		Prune: st.Prune,
		Keys: func(ctx context.Context) (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n)
			return n, err
		},
	}
}

func TestConformance(t *testing.T) {
	idemtest.Run(t, idemtest.Harness[pgx.Tx]{Open: open, SecondWriter: true})
}

func TestMigrationSQLAndStatus(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st := pgidempotency.New(pool)
	if err := st.CheckSchema(ctx); err == nil {
		t.Fatal("CheckSchema passed on an empty database")
	}
	if n, err := st.Migrate(ctx); err != nil || n != 1 {
		t.Fatalf("migrate: %d %v", n, err)
	}
	if n, err := st.Migrate(ctx); err != nil || n != 0 {
		t.Fatalf("migrate again: %d %v", n, err)
	}
	if sql := st.MigrationSQL(); len(sql) == 0 {
		t.Fatal("empty MigrationSQL")
	}
}
