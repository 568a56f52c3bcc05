package sqliteinbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/storetest"
)

// newFile returns the path of a fresh, migrated SQLite database with
// seeded accounts, and a handle on it.
func newFile(t testing.TB) (string, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "inbox.db")
	db := open(t, path)
	if _, err := sqliteinbox.New(db).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := effects.MigrateSQLite(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := effects.SeedAccountsSQLite(ctx, db, storetest.Accounts); err != nil {
		t.Fatal(err)
	}
	return path, db
}

func open(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sqliteinbox.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Snapshot reads the invariants' view of a SQLite database.
func snapshot(t testing.TB, db *sql.DB) storetest.Snapshot {
	t.Helper()
	s := storetest.Snapshot{Rows: map[string]string{}, Entries: map[string]int{}, EntryScopes: map[string][]string{},
		Balances: map[int64]int64{}, Conflicts: map[string]int{}}
	q := func(sql string, scan func(rows *sql.Rows) error) {
		rows, err := db.Query(sql)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				t.Fatal(err)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	q(`SELECT message_id, status FROM inbox WHERE scope = 'ledger'`, func(r *sql.Rows) error {
		var id, st string
		err := r.Scan(&id, &st)
		s.Rows[id] = st
		return err
	})
	q(`SELECT message_id, scope FROM ledger_entries`, func(r *sql.Rows) error {
		var id, scope string
		err := r.Scan(&id, &scope)
		s.Entries[id]++
		s.EntryScopes[id] = append(s.EntryScopes[id], scope)
		return err
	})
	q(`SELECT id, balance FROM accounts`, func(r *sql.Rows) error {
		var id, bal int64
		err := r.Scan(&id, &bal)
		s.Balances[id] = bal
		return err
	})
	q(`SELECT message_id, count(*) FROM inbox_conflicts GROUP BY message_id`, func(r *sql.Rows) error {
		var id string
		var n int
		err := r.Scan(&id, &n)
		s.Conflicts[id] = n
		return err
	})
	return s
}

// harness is SQLite under the conformance suite: each store is a handle of
// its own on the file, as another process would hold.
func harness() storetest.Harness[*sql.Tx] {
	return storetest.Harness[*sql.Tx]{
		Open: func(t testing.TB) storetest.DB[*sql.Tx] {
			path, db := newFile(t)
			return storetest.DB[*sql.Tx]{
				Store:       func() driver.Store[*sql.Tx] { return sqliteinbox.New(open(t, path)) },
				Snapshot:    func(t testing.TB) storetest.Snapshot { return snapshot(t, db) },
				Migrate:     func(ctx context.Context) (int, error) { return sqliteinbox.New(db).Migrate(ctx) },
				CheckSchema: func(ctx context.Context) error { return sqliteinbox.New(db).CheckSchema(ctx) },
				Prune: func(ctx context.Context, o inbox.PruneOptions) (int64, error) {
					return sqliteinbox.New(db).Prune(ctx, o)
				},
				Age: func(t testing.TB, d time.Duration) {
					if _, err := db.Exec(`UPDATE inbox SET received_at = received_at - ?`, d.Microseconds()); err != nil {
						t.Fatal(err)
					}
				},
			}
		},
		Ledger:          func() inbox.Handler[*sql.Tx] { return effects.NewSQLiteLedger() },
		PlantBlindClaim: func(s driver.Store[*sql.Tx]) { sqliteinbox.PlantBlindClaim(s.(*sqliteinbox.Store)) },
		Abort: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO accounts (id) VALUES ('not a number')`)
			return err
		},
		AbortReason: "datatype mismatch",
	}
}

// TestConformance runs the stores' conformance suite on SQLite.
func TestConformance(t *testing.T) { storetest.Run(t, harness()) }
