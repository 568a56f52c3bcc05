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
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
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
	if _, err := sqliteinbox.New(db).Migrate(ctx); err != nil {
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
	p, err := inbox.NewProcessor(sqliteinbox.New(db), NewSQLiteLedger(), inbox.Config{Scope: "audit"})
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
	p, err = inbox.NewProcessor(sqliteinbox.New(db), bound, inbox.Config{Scope: "other"})
	if err != nil {
		t.Fatal(err)
	}
	msg[0].ID = "m2"
	if out, _ := p.Process(ctx, msg); out[0].Status == inbox.StatusApplied || !strings.Contains(out[0].Reason, `bound to scope "ledger"`) {
		t.Fatalf("a ledger bound to another scope applied: %+v", out)
	}
}

// TestSQLiteLedgerFollowUps: the SQLite ledger with follow-ups adds one
// outbox row per applied credit in the batch's transaction (a rolled-back
// batch leaves none), with the ID, subject, payload and parent the
// PostgreSQL ledger writes; rejected intents and redeliveries add none, and
// a message whose follow-up ID is already there with other contents is
// rejected and applies nothing.
func TestSQLiteLedgerFollowUps(t *testing.T) {
	ctx := context.Background()
	db := sqliteLedgerDB(t, 8)
	if _, err := sqliteoutbox.New(db).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := NewScopedSQLiteLedger("ledger")
	if err != nil {
		t.Fatal(err)
	}
	if l, err = l.WithFollowUps(FollowUps{Subject: "notifications"}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSQLiteLedger().WithFollowUps(FollowUps{Subject: "notifications.>"}); err == nil {
		t.Fatal("a wildcard subject prefix was accepted")
	}
	count := func() int {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// A batch whose transaction rolls back leaves no follow-up behind.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 1)
	if err := l.Handle(ctx, tx, []inbox.Message{{ID: "r-1", Payload: []byte(`{"account":1,"amount":5}`)}}, errs); err != nil || errs[0] != nil {
		t.Fatal(err, errs[0])
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d outbox rows after a rolled-back batch, want 0: the follow-up was not written in the batch's transaction", n)
	}

	proc, err := inbox.NewProcessor(sqliteinbox.New(db), l, inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []inbox.Message
	for i := range 100 {
		msgs = append(msgs, inbox.Message{ID: fmt.Sprintf("m-%d", i), Payload: fmt.Appendf(nil, `{"account":%d,"amount":%d}`, 1+i%8, 10+i)})
	}
	msgs[7].Payload = []byte(`{"account":99,"amount":1}`) // unknown account: rejected
	msgs[9].Payload = []byte(`{"account":1`)              // bad input: rejected
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sqliteoutbox.Add(ctx, tx, inbox.Intent{ID: "notify:m-11", Subject: "notifications.4", Payload: []byte("other")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for pass := range 2 {
		batch := msgs
		if pass == 0 {
			batch = append(append([]inbox.Message(nil), msgs[:11]...), msgs[12:]...)
		}
		out, err := proc.Process(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			id := batch[i].ID
			want := inbox.StatusApplied
			if pass == 1 {
				want = inbox.StatusDuplicate
			}
			if id == "m-7" || id == "m-9" || id == "m-11" {
				want = inbox.StatusRejected
			}
			if o.Status != want {
				t.Fatalf("pass %d, %s: %v (%s), want %v", pass, id, o.Status, o.Reason, want)
			}
		}
	}
	var rows, wrong int
	if err := db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(id <> 'notify:' || parent_id OR subject <> 'notifications.' || (json_extract(CAST(payload AS TEXT), '$.account') % 16)), 0)
FROM outbox WHERE id <> 'notify:m-11'`).Scan(&rows, &wrong); err != nil {
		t.Fatal(err)
	}
	if rows != 97 || wrong != 0 {
		t.Fatalf("%d follow-ups (%d malformed), want one per applied credit: 97", rows, wrong)
	}
	var entries int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM ledger_entries WHERE scope = 'ledger' AND message_id = 'm-11'`).Scan(&entries); err != nil || entries != 0 {
		t.Fatalf("m-11, whose follow-up conflicted, has %d ledger entries (%v), want 0", entries, err)
	}
	var payload string
	if err := db.QueryRowContext(ctx, `SELECT CAST(payload AS TEXT) FROM outbox WHERE id = 'notify:m-3'`).Scan(&payload); err != nil || payload != `{"account":4,"amount":13}` {
		t.Fatalf("follow-up of m-3: %q, %v", payload, err)
	}
}
