package deploy_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// alertPipeline is a nats-server and a database with the streams, the
// ledger and a consumer of durable "ledger" running on them, for the tests
// that evaluate an alert on what the project's own metrics say.
type alertPipeline struct {
	ctx  context.Context
	js   jetstream.JetStream
	pool *pgxpool.Pool
	pub  *jsinbox.Publisher
	// consumer runs until the test ends.
	consumer *jsinbox.Consumer
}

// newAlertPipeline starts it; observer, if not nil, sees the consumer's
// batches.
func newAlertPipeline(t *testing.T, stream jsinbox.StreamConfig, observer jsinbox.Observer) *alertPipeline {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	p := &alertPipeline{ctx: ctx}
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	p.js, _ = jetstream.New(nc)
	if p.pool, err = pgxpool.New(ctx, testenv.NewDatabase(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.pool.Close)
	if err := pipeline.Setup(ctx, p.js, p.pool, stream, 16); err != nil {
		t.Fatal(err)
	}
	proc, err := inbox.NewProcessor(pginbox.New(p.pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	if p.consumer, err = jsinbox.NewConsumer(p.js, proc, jsinbox.ConsumerConfig{Durable: "ledger", Observer: observer}); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	cdone := make(chan error, 1)
	go func() { cdone <- p.consumer.Run(cctx) }()
	t.Cleanup(func() {
		ccancel()
		if err := <-cdone; err != nil {
			t.Error(err)
		}
	})
	if p.pub, err = jsinbox.NewPublisher(p.js, jsinbox.PublisherConfig{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.pub.Close)
	return p
}

// publishSettled publishes intents and waits until the consumer has
// settled them.
func (p *alertPipeline) publishSettled(t *testing.T, intents []inbox.Intent) {
	t.Helper()
	for _, in := range intents {
		if err := p.pub.PublishAsync(p.ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.pub.Flush(p.ctx); err != nil {
		t.Fatal(err)
	}
	if err := pipeline.WaitSettled(p.ctx, p.js, jsinbox.DefaultStream, "ledger", nil); err != nil {
		t.Fatal(err)
	}
}
