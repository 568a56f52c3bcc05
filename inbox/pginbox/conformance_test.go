package pginbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/storetest"
)

// pgSnapshot reads the invariants' view of a PostgreSQL database.
func pgSnapshot(t testing.TB, pool *pgxpool.Pool) storetest.Snapshot {
	t.Helper()
	ctx := context.Background()
	s := storetest.Snapshot{Rows: map[string]string{}, Entries: map[string]int{}, EntryScopes: map[string][]string{},
		Balances: map[int64]int64{}, Conflicts: map[string]int{}}
	q := func(sql string, scan func(rows pgx.Rows) error) {
		rows, err := pool.Query(ctx, sql)
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
	q(`SELECT message_id, status FROM inbox WHERE scope = 'ledger'`, func(r pgx.Rows) error {
		var id, st string
		err := r.Scan(&id, &st)
		s.Rows[id] = st
		return err
	})
	q(`SELECT message_id, scope FROM ledger_entries`, func(r pgx.Rows) error {
		var id, scope string
		err := r.Scan(&id, &scope)
		s.Entries[id]++
		s.EntryScopes[id] = append(s.EntryScopes[id], scope)
		return err
	})
	q(`SELECT id, balance FROM accounts`, func(r pgx.Rows) error {
		var id, bal int64
		err := r.Scan(&id, &bal)
		s.Balances[id] = bal
		return err
	})
	q(`SELECT message_id, count(*) FROM inbox_conflicts GROUP BY message_id`, func(r pgx.Rows) error {
		var id string
		var n int
		err := r.Scan(&id, &n)
		s.Conflicts[id] = n
		return err
	})
	return s
}

// pgHarness is PostgreSQL under the stores' conformance suite.
func pgHarness() storetest.Harness[pgx.Tx] {
	return storetest.Harness[pgx.Tx]{
		Open: func(t testing.TB) storetest.DB[pgx.Tx] {
			pool := newDB(t)
			return storetest.DB[pgx.Tx]{
				Store:    func() driver.Store[pgx.Tx] { return pginbox.New(pool) },
				Snapshot: func(t testing.TB) storetest.Snapshot { return pgSnapshot(t, pool) },
				Migrate: func(ctx context.Context) (int, error) {
					n, err := pginbox.New(pool).Migrate(ctx)
					if err != nil {
						return n, err
					}
					m, err := effects.Migrate(ctx, pool)
					return n + m, err
				},
				CheckSchema: func(ctx context.Context) error { return pginbox.New(pool).CheckSchema(ctx) },
				Prune:       func(ctx context.Context, o inbox.PruneOptions) (int64, error) { return pginbox.New(pool).Prune(ctx, o) },
				Age: func(t testing.TB, d time.Duration) {
					if _, err := pool.Exec(context.Background(), `UPDATE inbox SET received_at = received_at - $1::bigint * interval '1 microsecond'`, d.Microseconds()); err != nil {
						t.Fatal(err)
					}
				},
			}
		},
		Ledger:          func() inbox.Handler[pgx.Tx] { return effects.NewLedger() },
		PlantBlindClaim: pginbox.PlantBlindClaims,
		Abort: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1/0") // aborts the transaction
			return err
		},
		AbortReason:   "division by zero",
		SecondWriter:  true,
		CopyThreshold: pginbox.CopyClaimThreshold,
	}
}

// TestConformance runs the stores' conformance suite on PostgreSQL.
func TestConformance(t *testing.T) { storetest.Run(t, pgHarness()) }
