package inboxtest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inboxtest"
)

// A handler that records an email as sent, in the transaction of the
// inbox row, seen through each outcome the inbox can give it.
func Example() {
	ctx := context.Background()
	send := inbox.HandlerFunc(func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		var email struct{ To string }
		if err := json.Unmarshal(m.Payload, &email); err != nil || email.To == "" {
			return inbox.Permanent(errors.New("no recipient")) // rejected: dead-lettered with this reason
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sent (id, rcpt) VALUES (?, ?)`, m.ID, email.To); err != nil {
			return err
		}
		if email.To == "busy@example.com" {
			return errors.New("mail server busy") // after a write: rolled back, retried later
		}
		return nil
	})
	kit, err := inboxtest.SQLite(send, inbox.Config{Scope: "emails"})
	if err != nil {
		panic(err)
	}
	defer kit.Close()
	if _, err := kit.DB.ExecContext(ctx, `CREATE TABLE sent (id TEXT PRIMARY KEY, rcpt TEXT NOT NULL)`); err != nil {
		panic(err)
	}

	deliver := func(msgs ...inbox.Message) {
		out, err := kit.Deliver(ctx, msgs...)
		if err != nil {
			panic(err)
		}
		fmt.Println(inboxtest.Statuses(out))
	}
	deliver(inboxtest.Message("m-1", `{"to":"ann@example.com"}`), inboxtest.Message("m-2", `{}`))
	deliver(inboxtest.Message("m-1", `{"to":"ann@example.com"}`)) // redelivered
	deliver(inboxtest.Message("m-1", `{"to":"bob@example.com"}`)) // the ID reused for another email
	deliver(inboxtest.Message("m-3", `{"to":"busy@example.com"}`))

	var n int
	if err := kit.DB.QueryRowContext(ctx, `SELECT count(*) FROM sent`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("emails sent:", n)
	// Output:
	// applied rejected
	// duplicate
	// conflict
	// retry
	// emails sent: 1
}

// A handler written for PostgreSQL (pgx.Tx), tested on a schema of its own
// in a test database: a test of your own calls inboxtest.Postgres with its
// t, and the schema is dropped when the test ends.
func ExamplePostgres() {
	ship := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, m.ID)
		return err
	})
	testShip := func(t *testing.T) { // func TestShip(t *testing.T) in your package
		ctx := context.Background()
		kit := inboxtest.Postgres(t, os.Getenv("DATABASE_URL"), ship, inbox.Config{Scope: "shipping"})
		if _, err := kit.Pool.Exec(ctx, `CREATE TABLE shipments (order_id text PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"applied", "duplicate"} {
			out, err := kit.Deliver(ctx, inboxtest.Message("o-1", `{}`))
			if err != nil || inboxtest.Statuses(out) != want {
				t.Fatalf("%v, %v; want %s", out, err, want)
			}
		}
	}
	_ = testShip
}
