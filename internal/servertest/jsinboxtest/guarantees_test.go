package jsinboxtest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/faultconn"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
)

func waitRun(t *testing.T, r *running, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		t.Fatalf("consumer still running after %v", timeout)
		return nil
	}
}

// TestCrashPoints stops the consumer at each named crash point; a new
// consumer on the same durable then settles the stream with every intent
// applied exactly once.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	for _, point := range []hook.Point{failpoint.BeforeClaim, failpoint.BeforeCommit, failpoint.AfterCommit} {
		t.Run(point.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "", jsinbox.StreamConfig{})
			e.publish(t, load(500, "crash"))
			fp := failpoint.New()
			fp.EnableEvery(point, 3, 1) // the third batch dies there
			// Batches of 100 first deliveries take the COPY claim,
			// the default fast path.
			cfg := jsinbox.ConsumerConfig{BatchSize: 100, InFlight: 1, AckWait: time.Second}
			r := e.startConsumer(t, fp, nil, cfg)
			if err := waitRun(t, r, 30*time.Second); !failpoint.IsCrash(err) {
				t.Fatalf("Run = %v, want a crash", err)
			}
			if fp.Hits(point) != 1 {
				t.Fatalf("failpoint %s fired %d times", point, fp.Hits(point))
			}
			r2 := e.startConsumer(t, nil, nil, cfg)
			e.settle(t, time.Minute)
			e.assertClean(t, 500)
			if point == failpoint.AfterCommit && r2.c.Stats().Duplicates == 0 {
				t.Fatal("the batch committed before the crash came back, but no duplicate was seen")
			}
		})
	}
}

// slowHandler makes the first batches outlast AckWait.
type slowHandler struct {
	inner inbox.Handler[pgx.Tx]
	slow  atomic.Int32
	delay time.Duration
}

func (h *slowHandler) Handle(ctx context.Context, tx pgx.Tx, msgs []inbox.Message, errs []error) error {
	if h.slow.Add(-1) >= 0 {
		time.Sleep(h.delay)
	}
	return h.inner.Handle(ctx, tx, msgs, errs)
}

// TestTwoConsumersAckWaitTooShort: two consumers on one durable, AckWait
// shorter than the processing time: the server redelivers messages still
// being worked on, the other consumer takes them, the inbox settles it.
func TestTwoConsumersAckWaitTooShort(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	e.publish(t, load(1000, "two"))
	cfg := jsinbox.ConsumerConfig{BatchSize: 100, InFlight: 2, AckWait: 500 * time.Millisecond, KeepAlive: -1}
	slow := func() *slowHandler {
		h := &slowHandler{inner: effects.NewLedger(), delay: 900 * time.Millisecond}
		h.slow.Store(4)
		return h
	}
	a := e.startConsumer(t, nil, slow(), cfg)
	b := e.startConsumer(t, nil, slow(), cfg)
	e.settle(t, time.Minute)
	e.assertClean(t, 1000)
	sa, sb := a.c.Stats(), b.c.Stats()
	if sa.Redeliveries+sb.Redeliveries == 0 {
		t.Fatal("no redelivery happened: the test did not exercise concurrent duplicates")
	}
	if sa.Duplicates+sb.Duplicates == 0 {
		t.Fatal("no duplicate reached the inbox")
	}
	t.Logf("consumer A %+v", sa)
	t.Logf("consumer B %+v", sb)
}

// TestPoisonDeadLettered: bad payloads, an unknown account, a missing ID and
// a reused ID go to the dead-letter stream with a reason and are terminated;
// their neighbours are applied.
func TestPoisonDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{DuplicateWindow: 200 * time.Millisecond})
	good := load(200, "good")
	e.publish(t, good[:100])
	e.publishRaw(t, "intents.1", "bad-json", []byte(`{"account":1,`))
	e.publishRaw(t, "intents.1", "bad-type", []byte(`{"account":1,"amount":"5"}`))
	e.publishRaw(t, "intents.1", "unknown-account", []byte(`{"account":99999,"amount":5}`))
	e.publishRaw(t, "intents.1", "", []byte(`{"account":1,"amount":5}`))
	e.publishRaw(t, "intents.1", "bad\x01id", []byte(`{"account":1,"amount":5}`))
	e.publish(t, good[100:])
	time.Sleep(300 * time.Millisecond) // past the duplicate window
	e.publishRaw(t, good[0].Subject, good[0].ID, []byte(`{"account":2,"amount":1000}`))

	fp := failpoint.New()
	fp.Enable(failpoint.EffectPanic, 1)
	r := e.startConsumer(t, fp, nil, jsinbox.ConsumerConfig{BatchSize: 64})
	e.settle(t, time.Minute)
	rep := e.assertClean(t, 200)
	if rep.DeadLettered != 6 || rep.Conflicts != 1 || rep.Rejected != 3 {
		var b strings.Builder
		rep.WriteTable(&b)
		t.Fatalf("want 6 dead letters, 1 conflict, 3 rejected rows:\n%s", b.String())
	}
	if s := r.c.Stats(); s.DeadLettered != 6 {
		t.Fatalf("stats %+v", s)
	}
	dead, err := readDLQ(e)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"bad intent", "must be an integer", "unknown account 99999", "invalid message ID: empty", "control or space", "different payload"} {
		found := false
		for _, d := range dead {
			found = found || strings.Contains(d, want)
		}
		if !found {
			t.Errorf("no dead letter with reason %q in %q", want, dead)
		}
	}
}

func readDLQ(e *env) ([]string, error) {
	msgs, err := verify.ReadStream(context.Background(), e.js, jsinbox.DefaultStream+"_DLQ")
	if err != nil {
		return nil, err
	}
	var reasons []string
	for _, m := range msgs {
		reasons = append(reasons, m.Header[jsinbox.HeaderReason])
	}
	return reasons, nil
}

// TestPostgresOutage: PostgreSQL goes away under load. The consumer stops
// fetching while it is down (no redelivery storm) and applies everything
// once after it returns. The consumer is built from the processor alone:
// it pings through it, so no second field can be left out (one that did
// silently turned every outage into a redelivery storm).
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	url, err := pg.CreateDatabase(ctx, "outage")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, url, jsinbox.StreamConfig{})
	const n = 3000
	e.publish(t, load(n, "outage"))
	cfg := jsinbox.ConsumerConfig{BatchSize: 50, InFlight: 2, AckWait: 2 * time.Second,
		Nak: jitter.Policy{Kind: jitter.Decorrelated, Base: 100 * time.Millisecond, Cap: time.Second}}
	h := &slowHandler{inner: effects.NewLedger(), delay: 20 * time.Millisecond}
	h.slow.Store(1 << 30)
	r := e.startConsumer(t, nil, h, cfg)
	waitFor(t, 30*time.Second, func() bool { return r.c.Stats().Applied > 200 })
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool { return !r.c.Ready() })
	before := r.c.Stats().Received
	time.Sleep(3 * time.Second) // the outage
	during := r.c.Stats().Received - before
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e.settle(t, 2*time.Minute)
	e.assertClean(t, n)
	s := r.c.Stats()
	t.Logf("received %d deliveries for %d messages (%d while down), %d redeliveries, %d naks", s.Received, n, during, s.Redeliveries, s.Naks)
	if during > 0 {
		t.Fatalf("%d deliveries processed while the database was down: no circuit breaker", during)
	}
	// Bounded by what was in flight when the database went away, not by
	// the outage's length.
	if limit := int64(4 * cfg.BatchSize * 2 * 2); s.Redeliveries > limit {
		t.Fatalf("%d redeliveries, more than %d: a redelivery storm", s.Redeliveries, limit)
	}
}

// TestNATSRestart: the server restarts while intents are published and
// consumed: nothing acknowledged is lost, nothing applied twice.
func TestNATSRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	intents := load(4000, "restart")
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 100, AckWait: 2 * time.Second})
	done := make(chan jsinbox.PublisherStats)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := jsinbox.NewPublisher(e.js, jsinbox.PublisherConfig{AckTimeout: time.Second, MaxInFlight: 256})
		if err != nil {
			t.Error(err)
			done <- jsinbox.PublisherStats{}
			return
		}
		defer p.Close()
		for _, in := range intents {
			if err := p.PublishAsync(ctx, in); err != nil {
				t.Error(err)
				break
			}
		}
		_ = p.Flush(ctx)
		if f := p.Failures(); len(f) > 0 {
			t.Errorf("%d intents not published: %v", len(f), f[0])
		}
		done <- p.Stats()
	}()
	waitFor(t, 30*time.Second, func() bool { return r.c.Stats().Applied > 500 })
	if err := e.nats.Restart(); err != nil {
		t.Fatal(err)
	}
	st := <-done
	e.settle(t, 2*time.Minute)
	e.assertClean(t, len(intents))
	t.Logf("publisher %+v; consumer %+v", st, r.c.Stats())
}

// TestGracefulShutdown: cancelling Run in the middle of a stream returns nil,
// acks nothing that was not committed, and a later consumer finishes the
// stream.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	const n = 5000
	e.publish(t, load(n, "drain"))
	cfg := jsinbox.ConsumerConfig{BatchSize: 100}
	r := e.startConsumer(t, nil, nil, cfg)
	waitFor(t, 30*time.Second, func() bool { return r.c.Stats().Applied > 1000 })
	r.stop()
	if err := waitRun(t, r, 30*time.Second); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	assertAckedWereCommitted(t, e, n)
	e.startConsumer(t, nil, nil, cfg)
	e.settle(t, time.Minute)
	e.assertClean(t, n)
}

// assertAckedWereCommitted: every message the server considers acked has its
// inbox row. Acked = total - pending - ack-pending.
func assertAckedWereCommitted(t *testing.T, e *env, total int) {
	t.Helper()
	ctx := context.Background()
	c, err := e.js.Consumer(ctx, jsinbox.DefaultStream, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acked := total - int(info.NumPending) - info.NumAckPending
	var rows int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if acked > rows {
		t.Fatalf("%d messages acked but only %d inbox rows committed: acked before commit", acked, rows)
	}
	t.Logf("acked %d, committed %d", acked, rows)
}

// ackFirst is the bug "ack before commit" as a transport: JetStream whose
// consumers ack every message as it is delivered, before the consumer has
// even begun its transaction.
type ackFirst struct{ jetstream.JetStream }

func (j ackFirst) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	c, err := j.JetStream.Consumer(ctx, stream, name)
	return ackFirstConsumer{c}, err
}

func (j ackFirst) CreateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := j.JetStream.CreateConsumer(ctx, stream, cfg)
	return ackFirstConsumer{c}, err
}

type ackFirstConsumer struct{ jetstream.Consumer }

func (c ackFirstConsumer) Consume(h jetstream.MessageHandler, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	return c.Consumer.Consume(func(m jetstream.Msg) { _ = m.Ack(); h(m) }, opts...)
}

// TestAckBeforeCommitIsCaught runs the consumer on a transport that acks
// before commit and crashes batches before COMMIT: the checks must report
// lost intents.
func TestAckBeforeCommitIsCaught(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	const n = 300
	e.publish(t, load(n, "mut"))
	fp := failpoint.New()
	fp.EnableEvery(failpoint.BeforeCommit, 2, 1)
	cfg := jsinbox.ConsumerConfig{BatchSize: 100, InFlight: 1, AckWait: time.Second}
	r := e.startConsumer(t, fp, nil, cfg, func(js jetstream.JetStream) jetstream.JetStream { return ackFirst{js} })
	if err := waitRun(t, r, 30*time.Second); !failpoint.IsCrash(err) {
		t.Fatalf("Run = %v", err)
	}
	e.startConsumer(t, nil, nil, cfg)
	e.settle(t, time.Minute)
	rep := e.verify(t)
	if rep.Lost == 0 {
		t.Fatal("ack before commit lost nothing visible: the guarantee tests cannot catch it")
	}
	t.Logf("ack before commit caught: lost=%d", rep.Lost)
}

func waitFor(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCrashOnLastDeliveryRescued: a consumer dies with a batch on its last
// delivery; the server will not redeliver it (MaxDeliver reached) and sends a
// max-deliveries advisory instead. A running consumer rescues every such
// message from the stream: applied once, nothing lost.
func TestCrashOnLastDeliveryRescued(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	ctx := context.Background()
	if _, err := e.js.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{Durable: "ledger",
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 1, AckWait: time.Second, MaxAckPending: 1000}); err != nil {
		t.Fatal(err)
	}
	fp := failpoint.New()
	fp.Enable(failpoint.BeforeCommit, 1)
	a := e.startConsumer(t, fp, nil, jsinbox.ConsumerConfig{BatchSize: 50, InFlight: 1})
	e.publish(t, load(200, "last"))
	if err := waitRun(t, a, 30*time.Second); !failpoint.IsCrash(err) {
		t.Fatalf("consumer A: %v, want a crash", err)
	}
	// B starts once A crashed (started together, B could take every
	// message first), well within the AckWait after which the server
	// gives up on what A held.
	b := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 50, InFlight: 1})
	waitFor(t, 30*time.Second, func() bool { return b.c.Stats().Rescued > 0 })
	e.settle(t, 30*time.Second)
	waitFor(t, 10*time.Second, func() bool { return e.verify(t).AppliedOnce == 200 })
	e.assertClean(t, 200)
	t.Logf("rescued %d messages after the crash on their last delivery", b.c.Stats().Rescued)
}

// TestOutcomeUnknownOnLastDelivery: the connection is cut after the server
// committed a batch on its last delivery. The consumer cannot know it
// committed; one more transaction per message finds the rows, so the
// messages are acked, not dead-lettered as given up.
func TestOutcomeUnknownOnLastDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	cfg := e.pool.Config()
	inj := &faultconn.Injector{}
	cfg.ConnConfig.AfterNetConnect = inj.AfterNetConnect
	faulty, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer faulty.Close()
	if _, err := e.js.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{Durable: "ledger",
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 1, AckWait: 5 * time.Second, MaxAckPending: 1000}); err != nil {
		t.Fatal(err)
	}
	e.publish(t, load(100, "unk"))
	inj.Arm(faultconn.CutAfterCommit)
	proc, _ := inbox.NewProcessor(pginbox.New(faulty), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	c, _ := jsinbox.NewConsumer(e.js, proc, jsinbox.ConsumerConfig{BatchSize: 100})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	e.settle(t, 30*time.Second)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if inj.Fired() != 1 {
		t.Fatalf("the commit cut fired %d times", inj.Fired())
	}
	e.assertClean(t, 100)
	if s := c.Stats(); s.DeadLettered != 0 || s.FailedBatches == 0 {
		t.Fatalf("stats %+v: want a failed batch and no dead letters", s)
	}
}
