// Command worker ships orders: it applies each intent published on
// "intents.shipping" once, in the transaction of its inbox row, until SIGINT
// or SIGTERM. NATS_URL and DATABASE_URL say where the servers are.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv("NATS_URL"), os.Getenv("DATABASE_URL")); err != nil {
		slog.Error("worker stopped", "err", err)
		os.Exit(1)
	}
}

// run applies each order once until ctx ends, then drains and returns nil.
func run(ctx context.Context, natsURL, databaseURL string) error {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// The intents stream "INTENTS" on "intents.>" and its dead-letter
	// stream; existing ones are checked, never changed. The guarantee needs
	// the nats-server run with `jetstream { sync_interval: always }`, so
	// that a PubAck means the message is on disk.
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{}); err != nil {
		return err
	}
	// pgxpool.New with pginbox.WatchCommits: the store sees a COMMIT whose
	// wait for the synchronous standby was cancelled, which pgx takes for a success.
	pool, err := pginbox.NewPool(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := pginbox.New(pool)
	// The inbox schema comes from a deploy step (`jetinbox migrate`, or
	// store.Migrate); a worker only checks it is there and current.
	if err := store.CheckSchema(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS shipments (order_id text PRIMARY KEY, city text NOT NULL)`); err != nil {
		return err
	}
	ship := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		var order struct{ Order, City string }
		if err := json.Unmarshal(m.Payload, &order); err != nil || order.City == "" {
			return inbox.Permanent(errors.New("no city to ship to")) // dead-lettered with this reason
		}
		_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1, $2)`, order.Order, order.City)
		return err // commits with the inbox row, or not at all
	})
	log := slog.Default()
	proc, err := inbox.NewProcessor(store, ship, inbox.Config{Scope: "shipping", Logger: log})
	if err != nil {
		return err
	}
	consumer, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{Logger: log})
	if err != nil {
		return err
	}
	return consumer.Run(ctx) // logs a start-up line; acks after COMMIT; on cancel, drains and returns nil
}
