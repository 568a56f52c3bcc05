package effects

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
)

// sqliteLedgerDB opens a fresh SQLite file with the inbox and the ledger
// tables and accounts 1..accounts.
func sqliteLedgerDB(t *testing.T, accounts int) *sql.DB {
	t.Helper()
	ctx := context.Background()
	db, err := sqliteinbox.Open(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := sqliteinbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := MigrateSQLite(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := SeedAccountsSQLite(ctx, db, accounts); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestSQLiteLedgerBatch: a batch bigger than one statement's rows, over more
// accounts than one statement updates, with bad input and unknown accounts
// among them: every good intent has its entry and its amount, the others
// are bad input and wrote nothing.
func TestSQLiteLedgerBatch(t *testing.T) {
	ctx := context.Background()
	db := sqliteLedgerDB(t, 600)
	msgs := make([]inbox.Message, 1000)
	want := map[int64]int64{}
	for i := range msgs {
		acct := int64(1 + i%700) // 601..700 do not exist
		msgs[i] = inbox.Message{ID: fmt.Sprintf("b%d", i), Payload: Intent{Account: acct, Amount: int64(1 + i)}.AppendJSON(nil)}
		if i%97 == 0 {
			msgs[i].Payload = []byte(`{"account":1,`)
		} else if acct <= 600 {
			want[acct] += int64(1 + i)
		}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(msgs))
	if err := NewSQLiteLedger().Handle(ctx, tx, msgs, errs); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	entries := 0
	for i, e := range errs {
		acct := int64(1 + i%700)
		switch {
		case i%97 == 0 || acct > 600:
			if !errors.Is(e, inbox.ErrBadInput) {
				t.Fatalf("message %d (account %d): %v, want bad input", i, acct, e)
			}
		case e != nil:
			t.Fatalf("message %d: %v", i, e)
		default:
			entries++
		}
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM ledger_entries WHERE scope = 'ledger'`).Scan(&n); err != nil || n != entries {
		t.Fatalf("%d entries (%v), want %d", n, err, entries)
	}
	rows, err := db.Query(`SELECT id, balance FROM accounts`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, bal int64
		if err := rows.Scan(&id, &bal); err != nil {
			t.Fatal(err)
		}
		if bal != want[id] {
			t.Fatalf("account %d: balance %d, want %d", id, bal, want[id])
		}
	}
}

// TestSQLiteLedgerTakesTheProcessorsScope is TestLedgerTakesTheProcessorsScope
// on SQLite.
func TestSQLiteLedgerTakesTheProcessorsScope(t *testing.T) {
	ctx := context.Background()
	db := sqliteLedgerDB(t, 10)
	msg := []inbox.Message{{ID: "m1", Payload: Intent{Account: 1, Amount: 5}.AppendJSON(nil)}}
	p, err := sqliteinbox.NewProcessor(db, inbox.ConfigOf[*sql.Tx]{Scope: "audit", Handler: NewSQLiteLedger()})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := p.Process(ctx, msg); err != nil || out[0].Status != inbox.StatusApplied {
		t.Fatalf("Process = %+v, %v", out, err)
	}
	var scope string
	if err := db.QueryRow(`SELECT scope FROM ledger_entries WHERE message_id = 'm1'`).Scan(&scope); err != nil || scope != "audit" {
		t.Fatalf("entry scope %q, %v; want the processor's, audit", scope, err)
	}
	bound, err := NewScopedSQLiteLedger("ledger")
	if err != nil {
		t.Fatal(err)
	}
	p, err = sqliteinbox.NewProcessor(db, inbox.ConfigOf[*sql.Tx]{Scope: "other", Handler: bound})
	if err != nil {
		t.Fatal(err)
	}
	msg[0].ID = "m2"
	if out, _ := p.Process(ctx, msg); out[0].Status == inbox.StatusApplied || !strings.Contains(out[0].Reason, `bound to scope "ledger"`) {
		t.Fatalf("a ledger bound to another scope applied: %+v", out)
	}
}
