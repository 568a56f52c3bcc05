package effects

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// ledgerDB connects to a fresh database with the ledger tables and accounts
// 1..accounts.
func ledgerDB(t *testing.T, accounts int) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := SeedAccounts(ctx, conn, accounts); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestBalanceUpdatePlanIsOrdered checks the plan the balance updates run
// with, after orderedPlanSQL: a nested loop driven by the account array, so
// rows are locked in the (ascending) order Go sends. The plan is what keeps
// concurrent batches from deadlocking on shared accounts.
func TestBalanceUpdatePlanIsOrdered(t *testing.T) {
	ctx := context.Background()
	conn := ledgerDB(t, 5000)
	if _, err := conn.Exec(ctx, "ANALYZE accounts"); err != nil {
		t.Fatal(err)
	}
	for name, sql := range map[string]string{"large": applySQL, "small": applySmallSQL} {
		t.Run(name, func(t *testing.T) {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, orderedPlanSQL); err != nil {
				t.Fatal(err)
			}
			ids := make([]string, 3000)
			for i := range ids {
				ids[i] = strconv.Itoa(i + 1)
			}
			arr := "'{" + strings.Join(ids, ",") + "}'"
			args := arr + ", " + arr
			if name == "small" {
				args += ", '{a}', '{1}', '{1}', 'ledger'"
			}
			// EXPLAIN EXECUTE shows the plan a prepared statement runs with.
			if _, err := tx.Prepare(ctx, name, sql); err != nil {
				t.Fatal(err)
			}
			rows, err := tx.Query(ctx, "EXPLAIN (COSTS OFF) EXECUTE "+name+"("+args+")")
			if err != nil {
				t.Fatal(err)
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			plan := strings.Join(lines, "\n")
			at := strings.Index(plan, "Update on accounts")
			if at < 0 {
				t.Fatalf("no update in the plan:\n%s", plan)
			}
			upd := plan[at:]
			fn, idx := strings.Index(upd, "Function Scan"), strings.Index(upd, "Index Scan using accounts_pkey")
			if !strings.Contains(upd, "Nested Loop") || strings.Contains(upd, "Hash") || strings.Contains(upd, "Merge") ||
				fn < 0 || idx < 0 || fn > idx {
				t.Fatalf("balance update is not a nested loop driven by the account array:\n%s", plan)
			}
		})
	}
}

// TestPlannerSettingsRestored: the ledger's planner settings last only for
// its balance update; the rest of the transaction plans as before, including
// settings the session chose itself.
func TestPlannerSettingsRestored(t *testing.T) {
	ctx := context.Background()
	conn := ledgerDB(t, 10)
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off"); err != nil { // the session's own choice
		t.Fatal(err)
	}
	for _, n := range []int{1, copyThreshold} { // both statement paths
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		msgs := make([]inbox.Message, n)
		for i := range msgs {
			msgs[i] = inbox.Message{ID: fmt.Sprintf("m%d-%d", n, i), Payload: Intent{Account: 1 + int64(i%10), Amount: 1}.AppendJSON(nil)}
		}
		if err := NewLedger().Handle(ctx, tx, msgs, make([]error, n)); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := tx.QueryRow(ctx, `SELECT concat_ws(',', current_setting('enable_hashjoin'), current_setting('enable_mergejoin'), current_setting('enable_seqscan'), current_setting('plan_cache_mode'))`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != "on,on,off,auto" {
			t.Errorf("batch of %d: planner settings after the ledger: %s, want on,on,off,auto", n, got)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEntriesCarryTheScope: both statement paths write the ledger's scope
// into every entry, so effects can be counted per scope; two scopes applying
// the same message ID each get their own entry.
func TestEntriesCarryTheScope(t *testing.T) {
	ctx := context.Background()
	conn := ledgerDB(t, 10)
	if _, err := NewScopedLedger(""); err == nil {
		t.Fatal("NewScopedLedger accepted an empty scope")
	}
	for _, scope := range []string{"ledger", "audit"} {
		l, err := NewScopedLedger(scope)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{1, copyThreshold} { // both statement paths
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			msgs := make([]inbox.Message, n)
			for i := range msgs {
				msgs[i] = inbox.Message{ID: fmt.Sprintf("s%d-%d", n, i), Payload: Intent{Account: 1 + int64(i%10), Amount: 1}.AppendJSON(nil)}
			}
			if err := l.Handle(ctx, tx, msgs, make([]error, n)); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	rows, err := conn.Query(ctx, `SELECT scope, count(*), count(DISTINCT message_id) FROM ledger_entries GROUP BY scope ORDER BY scope`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var scope string
		var n, distinct int
		if err := rows.Scan(&scope, &n, &distinct); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s:%d/%d", scope, n, distinct))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("audit:%d/%d ledger:%d/%d", 1+copyThreshold, 1+copyThreshold, 1+copyThreshold, 1+copyThreshold); strings.Join(got, " ") != want {
		t.Fatalf("entries per scope: %v, want %s", got, want)
	}
}

// TestLedgerTakesTheProcessorsScope: a ledger from NewLedger writes the
// scope of the processor it runs under, whatever it is; a ledger bound to
// another scope refuses to write.
func TestLedgerTakesTheProcessorsScope(t *testing.T) {
	ctx := context.Background()
	conn := ledgerDB(t, 10)
	if _, err := pginbox.New(conn).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	msg := []inbox.Message{{ID: "m1", Payload: Intent{Account: 1, Amount: 5}.AppendJSON(nil)}}
	p, err := inbox.NewProcessor(pginbox.New(conn), NewLedger(), inbox.Config{Scope: "audit"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := p.Process(ctx, msg); err != nil || out[0].Status != inbox.StatusApplied {
		t.Fatalf("Process = %+v, %v", out, err)
	}
	var scope string
	if err := conn.QueryRow(ctx, `SELECT scope FROM ledger_entries WHERE message_id = 'm1'`).Scan(&scope); err != nil || scope != "audit" {
		t.Fatalf("entry scope %q, %v; want the processor's, audit", scope, err)
	}
	bound, err := NewScopedLedger("ledger")
	if err != nil {
		t.Fatal(err)
	}
	p, err = inbox.NewProcessor(pginbox.New(conn), bound, inbox.Config{Scope: "other"})
	if err != nil {
		t.Fatal(err)
	}
	msg[0].ID = "m2"
	if out, _ := p.Process(ctx, msg); out[0].Status == inbox.StatusApplied || !strings.Contains(out[0].Reason, `bound to scope "ledger"`) {
		t.Fatalf("a ledger bound to another scope applied: %+v", out)
	}
}
