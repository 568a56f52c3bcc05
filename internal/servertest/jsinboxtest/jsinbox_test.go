package jsinboxtest

import (
	"context"
	"github.com/jackc/pgx/v5"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
)

func TestMain(m *testing.M) { testenv.MainNoLeaks(m) }

const accounts = 64

type env struct {
	nats *natsenv.NATS
	nc   *nats.Conn
	js   jetstream.JetStream
	pool *pgxpool.Pool
	// logger, when set, is the processor's, and so the consumer's, logger
	// in startConsumer.
	logger *slog.Logger
}

func newEnv(t *testing.T, dbURL string, stream jsinbox.StreamConfig) *env {
	t.Helper()
	ctx := context.Background()
	e := &env{nats: natsenv.NewNATS(t, natsenv.NATSOptions{})}
	var err error
	e.nc, err = nats.Connect(e.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(50*time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.nc.Close)
	if e.js, err = jetstream.New(e.nc); err != nil {
		t.Fatal(err)
	}
	if dbURL == "" {
		dbURL = testenv.NewDatabase(t)
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	if e.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)
	if err := pipeline.Setup(ctx, e.js, e.pool, stream, accounts); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) publish(t *testing.T, intents []inbox.Intent) jsinbox.PublisherStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := jsinbox.NewPublisher(e.js, jsinbox.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, in := range intents {
		if err := p.PublishAsync(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if f := p.Failures(); len(f) > 0 {
		t.Fatalf("%d intents not published, first: %+v", len(f), f[0])
	}
	return p.Stats()
}

// publishRaw publishes a message as a hostile or broken producer would.
func (e *env) publishRaw(t *testing.T, subject, id string, payload []byte) {
	t.Helper()
	m := &nats.Msg{Subject: subject, Data: payload, Header: nats.Header{}}
	if id != "" {
		m.Header.Set(jetstream.MsgIDHeader, id)
	}
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

type running struct {
	c    *jsinbox.Consumer
	stop context.CancelFunc
	done chan error
}

// startConsumer runs a consumer on the ledger; fp, if not nil, arms its
// crash points; wrap, if given, stands between the consumer and JetStream.
func (e *env) startConsumer(t *testing.T, fp *failpoint.Set, handler inbox.Handler[pgx.Tx], cfg jsinbox.ConsumerConfig, wrap ...func(jetstream.JetStream) jetstream.JetStream) *running {
	t.Helper()
	if handler == nil {
		handler = effects.NewLedger()
	}
	proc, err := inbox.NewProcessor(pginbox.New(e.pool), handler, inbox.Config{Scope: "ledger", Logger: e.logger})
	if err != nil {
		t.Fatal(err)
	}
	js := e.js
	for _, w := range wrap {
		js = w(js)
	}
	c, err := jsinbox.NewConsumer(js, proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fp != nil {
		fp.Attach(proc, c)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &running{c: c, stop: stop, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("consumer did not stop within 30s")
		}
	})
	return r
}

func (e *env) settle(t *testing.T, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := pipeline.WaitSettled(ctx, e.js, jsinbox.DefaultStream, "ledger", nil); err != nil {
		t.Fatal(err)
	}
}

func (e *env) verify(t *testing.T) *verify.Report {
	t.Helper()
	r, err := verify.Run(context.Background(), e.js, e.pool, verify.Options{Scope: "ledger", Durable: "ledger", Ledger: true})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (e *env) assertClean(t *testing.T, wantApplied int) *verify.Report {
	t.Helper()
	r := e.verify(t)
	if !r.Clean() || (wantApplied >= 0 && r.AppliedOnce != wantApplied) {
		var b strings.Builder
		r.WriteTable(&b)
		t.Fatalf("pipeline not clean (want %d applied once):\n%s", wantApplied, b.String())
	}
	return r
}

func load(n int, prefix string) []inbox.Intent {
	return pipeline.Generate(pipeline.Load{Count: n, Accounts: accounts, Prefix: prefix, Seed: 1})
}

// TestEndToEnd: intents including duplicate publishes, inside the stream's
// duplicate window and after it, are applied exactly once.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	const window = 2 * time.Second
	e := newEnv(t, "", jsinbox.StreamConfig{DuplicateWindow: window})
	intents := load(2000, "e2e")
	e.publish(t, intents[:300])
	if st := e.publish(t, intents[:300]); st.Duplicates != 300 {
		t.Fatalf("server reported %d duplicates for 300 republished IDs", st.Duplicates)
	}
	last := time.Now()
	e.publish(t, intents[300:])
	// Copies after the window reach the stream as new messages: only the
	// inbox can catch them.
	time.Sleep(time.Until(last.Add(window + 200*time.Millisecond))) // let the duplicate window pass
	if st := e.publish(t, intents[:50]); st.Duplicates != 0 {
		t.Fatalf("server deduplicated %d copies after its window", st.Duplicates)
	}
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 100})
	e.settle(t, time.Minute)
	rep := e.assertClean(t, 2000)
	if rep.StreamMessages != 2050 {
		t.Fatalf("stream holds %d messages, want 2050", rep.StreamMessages)
	}
	if s := r.c.Stats(); s.Applied != 2000 || s.Duplicates != 50 || s.CopyClaims == 0 {
		t.Fatalf("consumer stats %+v, want 2000 applied, 50 duplicates, some batches claimed with COPY", s)
	}
}

// TestBindsOperatorDurable: a durable the operator created is used as it is
// (its MaxDeliver and AckWait win); an unsafe one is refused.
func TestBindsOperatorDurable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	if _, err := e.js.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{
		Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 7, AckWait: 3 * time.Second, MaxAckPending: 100,
	}); err != nil {
		t.Fatal(err)
	}
	e.publish(t, load(100, "bind"))
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{MaxDeliver: 20, AckWait: time.Minute})
	e.settle(t, 30*time.Second)
	e.assertClean(t, 100)
	if got := r.c.Config(); got.MaxDeliver != 7 || got.AckWait != 3*time.Second {
		t.Fatalf("consumer runs with MaxDeliver %d, AckWait %v; want the durable's 7 and 3s", got.MaxDeliver, got.AckWait)
	}
	// MaxAckPending 100 cannot hold 2 batches of 6000: the batch is
	// lowered to what fits, not silently capped by the server.
	if got := r.c.Config(); got.BatchSize != 50 {
		t.Fatalf("batch size %d under MaxAckPending 100 and 2 in flight, want 50", got.BatchSize)
	}
	info, err := e.js.Consumer(ctx, jsinbox.DefaultStream, "ledger")
	if err != nil || info.CachedInfo().Config.MaxAckPending != 100 {
		t.Fatalf("the operator's durable was changed: %+v, %v", info.CachedInfo().Config, err)
	}

	if _, err := e.js.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{
		Durable: "unsafe", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
	}); err != nil {
		t.Fatal(err)
	}
	proc, _ := inbox.NewProcessor(pginbox.New(e.pool), effects.NewLedger(), inbox.Config{Scope: "unsafe"})
	c, _ := jsinbox.NewConsumer(e.js, proc, jsinbox.ConsumerConfig{})
	if err := c.Run(ctx); err == nil || !strings.Contains(err.Error(), "MaxDeliver is unlimited") {
		t.Fatalf("Run on a durable with unlimited MaxDeliver: %v", err)
	}
}
