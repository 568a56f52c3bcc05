package jsinboxtest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// dlqCount is how many messages the dead-letter stream holds.
func dlqCount(t *testing.T, e *env) uint64 {
	t.Helper()
	s, err := e.js.Stream(context.Background(), jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// TestStopWhileDatabaseDownLetsGo: the consumer stops while the database
// is down, with messages on their last delivery in hand (a batch in its
// effect, more in the pull buffer). None of them may end dead-lettered as
// given up: the consumer lets go of them, the server gives up on them, and
// the next consumer rescues them from their advisories once the database
// is back: every intent applied once, the dead-letter stream empty.
func TestStopWhileDatabaseDownLetsGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	url, err := pg.CreateDatabase(ctx, "letgo")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, url, jsinbox.StreamConfig{})
	// Every delivery is the last one.
	if _, err := e.js.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{Durable: "ledger",
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 1, AckWait: 2 * time.Second, MaxAckPending: 1000}); err != nil {
		t.Fatal(err)
	}
	const n = 60
	e.publish(t, load(n, "letgo"))
	h := &slowHandler{inner: effects.NewLedger(), delay: 3 * time.Second}
	h.slow.Store(1)
	r := e.startConsumer(t, nil, h, jsinbox.ConsumerConfig{BatchSize: 20, InFlight: 1})
	waitFor(t, 30*time.Second, func() bool { return r.c.Stats().InFlight == 1 })
	// The first batch is in its effect; the others wait in the consumer.
	time.Sleep(500 * time.Millisecond)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	r.stop()
	if err := waitRun(t, r, 30*time.Second); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	if s := r.c.Stats(); s.DeadLettered != 0 || s.Applied != 0 || dlqCount(t, e) != 0 {
		var first string
		if dead := deadLetters(t, e); len(dead) > 0 {
			first = dead[0].Header[jsinbox.HeaderStatus] + ": " + dead[0].Header[jsinbox.HeaderReason]
		}
		t.Fatalf("stopping with the database down: stats %+v, %d dead letters (first %q); want nothing settled", s, dlqCount(t, e), first)
	}

	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	next := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 20})
	e.settle(t, time.Minute)
	waitFor(t, 30*time.Second, func() bool { return e.verify(t).AppliedOnce == n })
	e.assertClean(t, n)
	if s := next.c.Stats(); s.Rescued == 0 || s.DeadLettered != 0 || dlqCount(t, e) != 0 {
		t.Fatalf("next consumer: stats %+v, %d dead letters; want the messages let go rescued", s, dlqCount(t, e))
	}
}
