package sqliteinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
)

// A worker that keeps its inbox in a local file: the effect (here, a row
// in a table of its own) commits in the same transaction as the inbox row,
// and a redelivery changes nothing.
func ExampleNew() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	db, err := sqliteinbox.Open(ctx, filepath.Join(dir, "inbox.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := sqliteinbox.New(db).Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := db.Exec(`CREATE TABLE emails (message_id TEXT NOT NULL, body BLOB)`); err != nil {
		panic(err)
	}
	send := inbox.HandlerFunc(func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO emails (message_id, body) VALUES (?, ?)`, m.ID, m.Payload)
		return err
	})
	proc, err := inbox.NewProcessor(sqliteinbox.New(db), send, inbox.Config{Scope: "emails"})
	if err != nil {
		panic(err)
	}
	msg := inbox.Message{ID: "welcome-42", Payload: []byte("hello")}
	for range 2 { // the second is a redelivery
		out, err := proc.Process(ctx, []inbox.Message{msg})
		if err != nil {
			panic(err)
		}
		fmt.Println(out[0].Status, "ackable:", out[0].Ackable())
	}
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM emails`).Scan(&n)
	fmt.Println("emails:", n)
	// Output:
	// applied ackable: true
	// duplicate ackable: true
	// emails: 1
}
