package sqliteoutbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

// A service on a SQLite file writes its own row and the intent to announce
// it in one transaction; a relay leases the pending intents, publishes them
// with their IDs as Nats-Msg-Id and marks them sent. A retried request
// writes nothing new and emits no second message.
func Example() {
	ctx := context.Background()
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	// The example's own server and file; a service uses its own.
	srv, err := natsenv.StartNATS(natsenv.NATSOptions{})
	must(err)
	defer srv.Close()
	nc, err := nats.Connect(srv.URL())
	must(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(err)
	dir, err := os.MkdirTemp("", "sqliteoutbox-example-")
	must(err)
	defer os.RemoveAll(dir)
	// sqliteinbox.Open: WAL, synchronous=FULL, one writer at a time.
	db, err := sqliteinbox.Open(ctx, filepath.Join(dir, "service.db"))
	must(err)
	defer db.Close()

	// Deploy steps: the outbox table (`jetinbox migrate` applies it), the
	// service's own table, the stream the intents go to.
	ob := sqliteoutbox.New(db) // a consumer's store has it: sqliteinbox.New(db).Outbox()
	_, err = ob.Migrate(ctx)
	must(err)
	_, err = db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, cents INTEGER NOT NULL)`)
	must(err)
	_, err = jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{})
	must(err)

	// The request handler: the order row and the intent to charge for it
	// in one transaction, the intent's ID derived from the order's key.
	placeOrder := func(order string, cents int64) {
		tx, err := db.BeginTx(ctx, nil)
		must(err)
		defer tx.Rollback() //nolint:errcheck // after Commit a no-op
		_, err = tx.ExecContext(ctx, `INSERT INTO orders VALUES (?, ?) ON CONFLICT (id) DO NOTHING`, order, cents)
		must(err)
		must(sqliteoutbox.Add(ctx, tx, inbox.Intent{
			ID:      "charge-" + order,
			Subject: "intents.charge",
			Payload: fmt.Appendf(nil, `{"order":%q,"cents":%d}`, order, cents),
		}))
		must(tx.Commit())
	}
	placeOrder("o-1", 1250)
	placeOrder("o-2", 990)
	placeOrder("o-1", 1250) // the client retried

	// The relay, normally running in the background (Run, or `jetinbox
	// relay` with DATABASE_URL=sqlite:///path); here one round.
	relay, err := outbox.NewRelay(ob, js, outbox.RelayConfig{Stream: jsinbox.DefaultStream})
	must(err)
	defer relay.Close()
	n, err := relay.Round(ctx)
	must(err)
	fmt.Println("relayed", n, "sent", relay.Stats().Sent)
	pending, _, err := ob.Backlog(ctx)
	must(err)
	fmt.Println("pending", pending)

	s, err := js.Stream(ctx, jsinbox.DefaultStream)
	must(err)
	for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		must(err)
		fmt.Println(m.Header.Get(jetstream.MsgIDHeader), string(m.Data))
	}
	// Output:
	// relayed 2 sent 2
	// pending 0
	// charge-o-1 {"order":"o-1","cents":1250}
	// charge-o-2 {"order":"o-2","cents":990}
}
