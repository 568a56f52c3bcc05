package pginbox_test

import (
	"context"
	"fmt"
	"github.com/jackc/pgx/v5"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.MainNoLeaks(m) }

const accounts = 1024

// newDB returns a pool on a fresh, migrated database with seeded accounts.
func newDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return newDBAt(t, testenv.NewDatabase(t))
}

// newDBAt is newDB on the database at dbURL.
func newDBAt(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pginbox.WatchCommits(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pginbox.New(pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := effects.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := effects.SeedAccounts(ctx, pool, accounts); err != nil {
		t.Fatal(err)
	}
	return pool
}

func newLedgerProcessor(t *testing.T, pool *pgxpool.Pool) *inbox.Processor[pgx.Tx] {
	t.Helper()
	p, err := inbox.NewProcessor(pginbox.New(pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func intent(id string, account, amount int64) inbox.Message {
	return inbox.Message{ID: id, Payload: effects.Intent{Account: account, Amount: amount}.AppendJSON(nil), Deliveries: 1}
}

// ledgerViolations compares the database with the intents that should have
// been applied once each (want: message ID -> amount to account 1..n) and
// returns every broken invariant: duplicated or missing effects, effects
// without an inbox row, applied inbox rows without an effect, balances that
// do not add up.
func ledgerViolations(t *testing.T, pool *pgxpool.Pool, want map[string]inbox.Message) []string {
	t.Helper()
	ctx := context.Background()
	var v []string
	rows, err := pool.Query(ctx, `SELECT l.message_id, count(*), i.message_id IS NOT NULL
FROM ledger_entries l LEFT JOIN inbox i ON i.scope = 'ledger' AND i.message_id = l.message_id AND i.status = 'applied'
GROUP BY l.message_id, i.message_id`)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for rows.Next() {
		var id string
		var n int
		var hasRow bool
		if err := rows.Scan(&id, &n, &hasRow); err != nil {
			t.Fatal(err)
		}
		seen[id] = true
		if n > 1 {
			v = append(v, fmt.Sprintf("duplicated: %s has %d ledger entries", id, n))
		}
		if !hasRow {
			v = append(v, fmt.Sprintf("effect without applied inbox row: %s", id))
		}
		if _, ok := want[id]; !ok {
			v = append(v, fmt.Sprintf("unexpected: %s applied", id))
		}
	}
	rows.Close()
	for id := range want {
		if !seen[id] {
			v = append(v, fmt.Sprintf("lost: %s not applied", id))
		}
	}
	var orphans int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox i WHERE i.status = 'applied'
AND NOT EXISTS (SELECT 1 FROM ledger_entries l WHERE l.message_id = i.message_id)`).Scan(&orphans); err != nil {
		t.Fatal(err)
	}
	if orphans > 0 {
		v = append(v, fmt.Sprintf("%d applied inbox rows without an effect", orphans))
	}
	wantBal := map[int64]int64{}
	for _, m := range want {
		in, err := effects.ParseIntent(m.Payload)
		if err != nil {
			t.Fatal(err)
		}
		wantBal[in.Account] += in.Amount
	}
	rows, err = pool.Query(ctx, `SELECT id, balance FROM accounts ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, bal int64
		if err := rows.Scan(&id, &bal); err != nil {
			t.Fatal(err)
		}
		if bal != wantBal[id] {
			v = append(v, fmt.Sprintf("account %d balance %d, want %d", id, bal, wantBal[id]))
		}
	}
	sort.Strings(v)
	return v
}

func assertClean(t *testing.T, pool *pgxpool.Pool, want map[string]inbox.Message) {
	t.Helper()
	if v := ledgerViolations(t, pool, want); len(v) > 0 {
		t.Fatalf("invariants broken:\n%s", strings.Join(v, "\n"))
	}
}

func statuses(out []inbox.Outcome) string {
	s := make([]string, len(out))
	for i, o := range out {
		s[i] = o.Status.String()
	}
	return strings.Join(s, ",")
}
