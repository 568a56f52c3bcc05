package jsinbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// The README's Go blocks are the code between each "readme:begin" line and
// the next "readme:end" line below, in order; TestReadmeExample fails when
// they differ, so the README shows only code that compiles and runs here.

// readme:begin
// shipOrders applies each order once, in the transaction of its inbox row, until ctx ends.
func shipOrders(ctx context.Context, js jetstream.JetStream, databaseURL string) error {
	// pgxpool.New with pginbox.WatchCommits: the store sees a COMMIT whose
	// wait for the synchronous standby was cancelled, which pgx takes for a success.
	pool, err := pginbox.NewPool(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	ship := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		var order struct{ Order, City string }
		if err := json.Unmarshal(m.Payload, &order); err != nil || order.City == "" {
			return inbox.Permanent(errors.New("no city to ship to")) // dead-lettered with this reason
		}
		_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1, $2)`, order.Order, order.City)
		return err
	})
	// One store value: the processor claims through it, and the consumer
	// checks the database through the processor: it refuses one it cannot
	// use and pauses while the database is down.
	proc, err := inbox.NewProcessor(pginbox.New(pool), ship, inbox.Config{Scope: "shipping"})
	if err != nil {
		return err
	}
	consumer, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{})
	if err != nil {
		return err
	}
	return consumer.Run(ctx) // acks after COMMIT; on cancel, drains and returns nil
}

// readme:end

// readme:begin
// placeOrder publishes an intent whose ID is fixed when the order is made, so
// a retry of it, however late, is dropped and never ships twice.
func placeOrder(ctx context.Context, pub *jsinbox.Publisher, order, city string) error {
	body, _ := json.Marshal(map[string]string{"order": order, "city": city})
	_, err := pub.PublishWait(ctx, inbox.Intent{ID: "ship-" + order, Subject: "intents.shipping", Payload: body})
	return err
}

// readme:end

// The README's example, run: orders placed (one twice, one with no city),
// shipOrders applying them, and what it left behind.
func Example_readme() {
	ctx := context.Background()
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}

	// What the README leaves to the deployment: the servers (here an
	// embedded nats-server and a database on the test binary's throwaway
	// PostgreSQL), the streams, and the schema (`jetinbox migrate`).
	srv, err := testenv.StartNATS(testenv.NATSOptions{})
	must(err)
	defer srv.Close()
	nc, err := nats.Connect(srv.URL())
	must(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(err)
	url, err := testenv.CreateSharedDatabase("jsinbox_readme")
	must(err)
	pool, err := pgxpool.New(ctx, url)
	must(err)
	defer pool.Close()
	_, err = pginbox.New(pool).Migrate(ctx)
	must(err)
	_, err = pool.Exec(ctx, `CREATE TABLE shipments (order_id text NOT NULL, city text NOT NULL)`)
	must(err)
	_, err = jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{})
	must(err)

	run, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- shipOrders(run, js, url) }()

	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	must(err)
	defer pub.Close()
	must(placeOrder(ctx, pub, "o-1", "Lisbon"))
	must(placeOrder(ctx, pub, "o-2", "Oslo"))
	must(placeOrder(ctx, pub, "o-1", "Lisbon")) // a retry: same ID
	must(placeOrder(ctx, pub, "o-3", ""))

	// Wait for the two shipments and the one dead letter, then stop.
	dlq, err := js.Stream(ctx, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	must(err)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var shipped int
		must(pool.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&shipped))
		info, err := dlq.Info(ctx)
		must(err)
		if shipped == 2 && info.State.Msgs == 1 {
			break
		}
	}
	stop()
	must(<-done)

	rows, err := pool.Query(ctx, `SELECT order_id, city FROM shipments ORDER BY order_id`)
	must(err)
	for rows.Next() {
		var order, city string
		must(rows.Scan(&order, &city))
		fmt.Println("shipped", order, "to", city)
	}
	must(rows.Err())
	dl, err := dlq.GetMsg(ctx, 1)
	must(err)
	fmt.Println("dead letter", dl.Header.Get(jsinbox.HeaderMessageID)+":", dl.Header.Get(jsinbox.HeaderReason))
	// Output:
	// shipped o-1 to Lisbon
	// shipped o-2 to Oslo
	// dead letter ship-o-3: no city to ship to
}

// TestReadmeExample: the README's Go blocks are, in order, the readme:begin
// … readme:end regions of this file, so code the README shows compiles and
// Example_readme runs it.
func TestReadmeExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("example_readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	shown := fencedBlocks(string(readme), "```go")
	compiled := markedRegions(t, string(self))
	if len(compiled) == 0 {
		t.Fatal("example_readme_test.go has no readme:begin … readme:end region")
	}
	if len(shown) != len(compiled) {
		t.Errorf("the README has %d Go blocks, example_readme_test.go %d regions: every Go block in the README must be a region here", len(shown), len(compiled))
	}
	for i := range min(len(shown), len(compiled)) {
		if shown[i] != compiled[i] {
			t.Errorf("the README's Go block %d differs from region %d of example_readme_test.go; make it\n%s", i+1, i+1, compiled[i])
		}
	}
}

// fencedBlocks returns the bodies of the blocks of doc that open with the
// line fence, without surrounding blank lines.
func fencedBlocks(doc, fence string) []string {
	var blocks []string
	var cur []string
	in := false
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case !in && strings.TrimSpace(line) == fence:
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			blocks = append(blocks, strings.Trim(strings.Join(cur, "\n"), "\n"))
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

// markedRegions returns the code between each "// readme:begin" line and
// the next "// readme:end" line of src, without surrounding blank lines.
func markedRegions(t *testing.T, src string) []string {
	t.Helper()
	var regions []string
	var cur []string
	in := false
	for i, line := range strings.Split(src, "\n") {
		switch strings.TrimSpace(line) {
		case "// readme:begin":
			if in {
				t.Fatalf("example_readme_test.go:%d: readme:begin inside a region", i+1)
			}
			in, cur = true, nil
		case "// readme:end":
			if !in {
				t.Fatalf("example_readme_test.go:%d: readme:end outside a region", i+1)
			}
			in = false
			regions = append(regions, strings.Trim(strings.Join(cur, "\n"), "\n"))
		default:
			if in {
				cur = append(cur, line)
			}
		}
	}
	if in {
		t.Fatal("example_readme_test.go: a readme:begin region does not end")
	}
	return regions
}
