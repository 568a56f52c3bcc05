package sqliteidempotency_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/sqliteidempotency"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/idemtest"
)

func open(t testing.TB) idemtest.DB[*sql.Tx] {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	newDB := func() *sql.DB {
		db, err := sqliteinbox.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	db := newDB()
	st := sqliteidempotency.New(db)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (what TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return idemtest.DB[*sql.Tx]{
		Store: func() idempotency.Store[*sql.Tx] { return sqliteidempotency.New(newDB()) },
		Effect: func(ctx context.Context, tx *sql.Tx, what string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES (?)`, what)
			return err
		},
		Effects: func(ctx context.Context) (map[string]int, error) {
			rows, err := db.QueryContext(ctx, `SELECT what, count(*) FROM effects GROUP BY what`)
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
			_, err := db.ExecContext(ctx, `UPDATE idempotency_keys SET created_at = created_at - ?`, d.Microseconds())
			return err
		},
		Prune: st.Prune,
		Keys: func(ctx context.Context) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n)
			return n, err
		},
	}
}

func TestConformance(t *testing.T) {
	idemtest.Run(t, idemtest.Harness[*sql.Tx]{Open: open})
}
