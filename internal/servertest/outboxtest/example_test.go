package outboxtest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// A service that writes its own row and announces it replaces "write the
// row, then publish" (a crash in between loses the message) with one
// transaction: the row and the outbox intent commit together, and the relay
// publishes the intent with its ID as Nats-Msg-Id. A retried request writes
// nothing new and emits no second message.
func Example_producer() {
	ctx := context.Background()
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	// The example's own servers; a service connects to its own.
	srv, err := natsenv.StartNATS(natsenv.NATSOptions{})
	must(err)
	defer srv.Close()
	nc, err := nats.Connect(srv.URL())
	must(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(err)
	url, err := testenv.CreateSharedDatabase("outbox_example")
	must(err)
	pool, err := pgxpool.New(ctx, url)
	must(err)
	defer pool.Close()

	// Deploy steps: the outbox table (`jetinbox migrate` applies it), the
	// service's own table, the stream the intents go to.
	ob := pgoutbox.New(pool) // a consumer's store has it: pginbox.New(pool).Outbox()
	_, err = ob.Migrate(ctx)
	must(err)
	_, err = pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, cents bigint NOT NULL)`)
	must(err)
	_, err = jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{})
	must(err)

	// The request handler: the order row and the intent to charge for it
	// in one transaction. The intent's ID comes from the order's own key,
	// so a retried request emits the same one.
	placeOrder := func(order string, cents int64) {
		must(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, order, cents); err != nil {
				return err
			}
			return pgoutbox.Add(ctx, tx, inbox.Intent{
				ID:      "charge-" + order,
				Subject: "intents.charge",
				Payload: fmt.Appendf(nil, `{"order":%q,"cents":%d}`, order, cents),
			})
		}))
	}
	placeOrder("o-1", 1250)
	placeOrder("o-2", 990)
	placeOrder("o-1", 1250) // the client retried

	// The relay, normally running in the background (Run, or `jetinbox
	// relay`); here one round drains the outbox.
	relay, err := outbox.NewRelay(ob, js, outbox.RelayConfig{Stream: jsinbox.DefaultStream})
	must(err)
	defer relay.Close()
	n, err := relay.Round(ctx)
	must(err)
	fmt.Println("relayed", n, "sent", relay.Stats().Sent)

	s, err := js.Stream(ctx, jsinbox.DefaultStream)
	must(err)
	for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		must(err)
		fmt.Println(m.Header.Get(jetstream.MsgIDHeader), string(m.Data))
	}
	// Output:
	// relayed 2 sent 2
	// charge-o-1 {"order":"o-1","cents":1250}
	// charge-o-2 {"order":"o-2","cents":990}
}
