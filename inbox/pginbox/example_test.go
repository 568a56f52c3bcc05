package pginbox_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// exampleDB returns a migrated database on the test binary's throwaway
// PostgreSQL, with ten ledger accounts.
func exampleDB(ctx context.Context, name string) *pgxpool.Pool {
	url, err := testenv.CreateSharedDatabase(name)
	if err != nil {
		panic(err)
	}
	pool, err := pginbox.NewPool(ctx, url) // pgxpool.New with pginbox.WatchCommits
	if err != nil {
		panic(err)
	}
	if _, err := pginbox.New(pool).Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := effects.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if err := effects.SeedAccounts(ctx, pool, 10); err != nil {
		panic(err)
	}
	return pool
}

// A worker that embeds the inbox claims messages inside its own transaction,
// applies the fresh ones' effects in the same transaction, and commits before
// it acknowledges anything.
func ExampleClaimTx() {
	ctx := context.Background()
	pool := exampleDB(ctx, "claimtx")
	defer pool.Close()

	handle := func(id string, payload []byte) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		defer tx.Rollback(ctx)
		res, err := pginbox.ClaimTx(ctx, tx, "billing", []driver.Claim{{ID: id, Fingerprint: inbox.Fingerprint(payload)}})
		if err != nil {
			panic(err)
		}
		if res[0].State == driver.ClaimFresh {
			// The side effect, in the same transaction as the claim.
			if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 100 WHERE id = 1`); err != nil {
				panic(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			panic(err) // outcome unknown: do not ack; the redelivery settles it
		}
		fmt.Println(id, res[0].State) // now it is safe to ack
	}
	handle("charge-1", []byte(`{"cents":100}`))
	handle("charge-1", []byte(`{"cents":100}`)) // redelivered
	handle("charge-1", []byte(`{"cents":999}`)) // same ID, other payload

	var balance int
	_ = pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 1`).Scan(&balance)
	fmt.Println("balance", balance)
	// Output:
	// charge-1 fresh
	// charge-1 duplicate
	// charge-1 conflict
	// balance 100
}

// A Processor runs a batch in one transaction and says, per message, whether
// to ack, dead-letter or retry it.
func Example_process() {
	ctx := context.Background()
	pool := exampleDB(ctx, "process")
	defer pool.Close()

	p, err := inbox.NewProcessor(pginbox.New(pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		panic(err)
	}
	batch := []inbox.Message{
		{ID: "t-1", Payload: []byte(`{"account":1,"amount":250}`)},
		{ID: "t-2", Payload: []byte(`{"account":2,"amount":-5}`)},
		{ID: "t-1", Payload: []byte(`{"account":1,"amount":250}`)},
	}
	out, err := p.Process(ctx, batch)
	if err != nil {
		panic(err) // nothing is ackable; naks with a jittered delay
	}
	for i, o := range out {
		fmt.Println(strings.TrimSpace(fmt.Sprintf("%s %s ack=%v %s", batch[i].ID, o.Status, o.Ackable(), o.Reason)))
	}
	// Output:
	// t-1 applied ack=true
	// t-2 rejected ack=false effects: bad intent: amount -5 must be positive
	// t-1 duplicate ack=true
}

// An effect written as a function of one message; HandlerFunc adapts it.
// Returning a Permanent error rejects the message; its neighbours still
// commit.
func Example_handlerFunc() {
	ctx := context.Background()
	pool := exampleDB(ctx, "handlerfunc")
	defer pool.Close()

	notify := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if len(m.Payload) == 0 {
			return inbox.Permanent(fmt.Errorf("empty notification"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger_entries (message_id, account, amount) VALUES ($1, 1, 1)`, m.ID)
		return err
	})
	p, _ := inbox.NewProcessor(pginbox.New(pool), notify, inbox.Config{Scope: "notify"})
	out, _ := p.Process(ctx, []inbox.Message{{ID: "n-1", Payload: []byte("hi")}, {ID: "n-2"}, {ID: "n-3", Payload: []byte("yo")}})
	for _, o := range out {
		fmt.Println(strings.TrimSpace(o.Status.String() + " " + o.Reason))
	}
	// Output:
	// applied
	// rejected empty notification
	// applied
}
