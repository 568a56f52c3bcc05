package jsinboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// A service that embeds jetinbox publishes intents with IDs chosen when
// they are created, and runs a consumer that applies each intent's effect
// in the same PostgreSQL transaction as its inbox row, then acks. A
// publish retried with the same ID is dropped by the stream; an intent the
// effect cannot apply goes to the dead-letter stream with its reason.
func ExampleConsumer() {
	ctx := context.Background()
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}

	// The example's own servers: an embedded nats-server and a database on
	// the test binary's throwaway PostgreSQL. A service connects to its own.
	srv, err := natsenv.StartNATS(natsenv.NATSOptions{})
	must(err)
	defer srv.Close()
	nc, err := nats.Connect(srv.URL())
	must(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(err)
	url, err := testenv.CreateSharedDatabase("jsinbox_example")
	must(err)
	pool, err := pginbox.NewPool(ctx, url) // pgxpool.New with pginbox.WatchCommits
	must(err)
	defer pool.Close()

	// Deploy steps: the inbox schema, the service's own table, and the
	// intents stream with its dead-letter and advisory streams.
	_, err = pginbox.New(pool).Migrate(ctx)
	must(err)
	_, err = pool.Exec(ctx, `CREATE TABLE shipments (order_id text NOT NULL, city text NOT NULL)`)
	must(err)
	_, err = jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{})
	must(err)

	// The effect, run in the inbox's transaction for fresh intents only. A
	// Permanent error rejects the intent; its neighbours still commit.
	ship := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		var order struct{ Order, City string }
		if err := json.Unmarshal(m.Payload, &order); err != nil || order.City == "" {
			return inbox.Permanent(errors.New("no city to ship to"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1, $2)`, order.Order, order.City)
		return err
	})
	proc, err := inbox.NewProcessor(pginbox.New(pool), ship, inbox.Config{Scope: "shipping"})
	must(err)
	consumer, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{})
	must(err)
	run, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(run) }()

	// The producer side. The second "ship-1" is a retry of the first.
	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	must(err)
	for _, in := range []inbox.Intent{
		{ID: "ship-1", Subject: "intents.shipping", Payload: []byte(`{"order":"o-1","city":"Lisbon"}`)},
		{ID: "ship-2", Subject: "intents.shipping", Payload: []byte(`{"order":"o-2","city":"Oslo"}`)},
		{ID: "ship-1", Subject: "intents.shipping", Payload: []byte(`{"order":"o-1","city":"Lisbon"}`)},
		{ID: "ship-3", Subject: "intents.shipping", Payload: []byte(`{"order":"o-3"}`)},
	} {
		must(pub.PublishAsync(ctx, in))
	}
	must(pub.Flush(ctx))
	pub.Close()
	ps := pub.Stats()
	fmt.Printf("published %d, dropped by the stream as duplicates %d, failed %d\n", ps.Published, ps.Duplicates, ps.Failed)

	// Wait until the three distinct intents are settled, then stop.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if s := consumer.Stats(); s.Applied+s.DeadLettered == 3 || time.Now().After(deadline) {
			break
		}
	}
	stop()
	must(<-done)
	cs := consumer.Stats()
	fmt.Printf("applied %d, dead-lettered %d\n", cs.Applied, cs.DeadLettered)

	rows, err := pool.Query(ctx, `SELECT order_id, city FROM shipments ORDER BY order_id`)
	must(err)
	for rows.Next() {
		var order, city string
		must(rows.Scan(&order, &city))
		fmt.Println("shipped", order, "to", city)
	}
	must(rows.Err())

	dlq, err := js.Stream(ctx, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	must(err)
	dl, err := dlq.GetMsg(ctx, 1)
	must(err)
	fmt.Println("dead letter", dl.Header.Get(jsinbox.HeaderMessageID)+":", dl.Header.Get(jsinbox.HeaderReason))
	// Output:
	// published 4, dropped by the stream as duplicates 1, failed 0
	// applied 2, dead-lettered 1
	// shipped o-1 to Lisbon
	// shipped o-2 to Oslo
	// dead letter ship-3: no city to ship to
}
