package jsinboxtest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// The edges where an intent could end neither applied nor dead-lettered,
// or be dead-lettered twice. Each test here failed before its fix.

func deadLetters(t *testing.T, e *env) []verify.Message {
	t.Helper()
	dead, err := verify.ReadStream(context.Background(), e.js, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	return dead
}

// TestAtomicBatchIntentsDeadLettered: JetStream stores the Nats-Batch-*
// headers with every message of an atomic batch, and a producer may set
// Nats-Expected-Stream. Copied into a dead letter, either makes the
// dead-letter stream refuse it. Poison intents published in atomic batches,
// or with that header, must still end dead-lettered.
func TestAtomicBatchIntentsDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	intents := load(40, "atomic")
	for i := 5; i < len(intents); i += 10 {
		intents[i].Payload = []byte(`{"account":1,`) // poison
	}
	st := publishAll(t, ctx, e.js, jsinbox.PublisherConfig{Batch: 20, Linger: 50 * time.Millisecond}, intents)
	if st.Batches == 0 {
		t.Fatalf("no atomic batch stored: %+v", st)
	}
	m := &nats.Msg{Subject: "intents.1", Data: []byte(`{"account":1,"amount":"x"}`),
		Header: nats.Header{jetstream.MsgIDHeader: {"expects-stream"}, "Nats-Expected-Stream": {jsinbox.DefaultStream}, "X-Trace": {"kept"}}}
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 16, MaxDeliver: 3, AckWait: 2 * time.Second})
	e.settle(t, time.Minute)
	waitFor(t, 30*time.Second, func() bool { return r.c.Stats().DeadLettered == 5 })
	rep := e.assertClean(t, 36)
	if rep.DeadLettered != 5 {
		t.Fatalf("%d dead letters, want 5", rep.DeadLettered)
	}
	for _, d := range deadLetters(t, e) {
		// Only the dead-letter publish's own JetStream headers: its ID
		// and the pin to the dead-letter stream.
		for k, v := range d.Header {
			switch {
			case k == jetstream.MsgIDHeader && v != d.Header[jsinbox.HeaderMessageID]:
			case k == "Nats-Expected-Stream" && v == jsinbox.DeadLetterStream(jsinbox.DefaultStream):
			case strings.HasPrefix(strings.ToLower(k), "nats-"):
				t.Errorf("dead letter %s carries the original's JetStream header %s: %s", d.Header[jsinbox.HeaderMessageID], k, v)
			}
		}
		if d.Header[jsinbox.HeaderMessageID] == "expects-stream" && d.Header["X-Trace"] != "kept" {
			t.Errorf("the producer's own header was not kept: %v", d.Header)
		}
	}
}

// TestDeadLetterHeldUntilStreamTakesIt: the dead-letter stream is missing
// when a poison message is on its final delivery. The consumer holds the
// message, is not ready, counts it, and dead-letters it once the stream is
// back: nothing is dropped.
func TestDeadLetterHeldUntilStreamTakesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	if err := e.js.DeleteStream(ctx, jsinbox.DeadLetterStream(jsinbox.DefaultStream)); err != nil {
		t.Fatal(err)
	}
	e.publish(t, load(20, "held"))
	e.publishRaw(t, "intents.1", "poison", []byte(`{"account":1,`))
	cfg := jsinbox.ConsumerConfig{BatchSize: 50, MaxDeliver: 1, AckWait: time.Second}
	cfg.DeadLetterRetry.Base, cfg.DeadLetterRetry.Cap = 20*time.Millisecond, 200*time.Millisecond
	r := e.startConsumer(t, nil, nil, cfg)
	waitFor(t, 30*time.Second, func() bool { return r.c.Stats().DeadLettersHeld == 1 })
	if r.c.Ready() {
		t.Fatal("ready while holding a message the dead-letter stream refused")
	}
	// Held across several AckWaits: the server must not give up on it.
	time.Sleep(3 * cfg.AckWait)
	if s := r.c.Stats(); s.DeadLettersHeld != 1 || s.Rescued != 0 {
		t.Fatalf("stats %+v: want the message still held", s)
	}
	if _, err := jsinbox.EnsureStream(ctx, e.js, jsinbox.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool { s := r.c.Stats(); return s.DeadLettered == 1 && s.DeadLettersHeld == 0 })
	waitFor(t, 10*time.Second, r.c.Ready)
	e.settle(t, 30*time.Second)
	e.assertClean(t, 20)
}

// TestCrashOnLastDeliveryNobodyListening: with MaxDeliver 2, a consumer
// takes the batch and dies, a second one takes it again and dies too, and
// then no consumer runs while the server gives up on the batch. The
// advisory it sends then has no listener; a consumer started later must
// still rescue every message.
func TestCrashOnLastDeliveryNobodyListening(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	cons, err := e.js.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{Durable: "ledger",
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 2, AckWait: time.Second, MaxAckPending: 1000})
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	e.publish(t, load(n, "nobody"))
	// Each life takes every message and settles none, as a consumer that
	// dies before its commit does.
	for life := 1; life <= 2; life++ {
		for got := 0; got < n; {
			b, err := cons.Fetch(n-got, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for m := range b.Messages() {
				if md, _ := m.Metadata(); md.NumDelivered != uint64(life) {
					t.Fatalf("delivery %d in life %d", md.NumDelivered, life)
				}
				got++
			}
		}
	}
	// The second one hangs with a pull request outstanding. The server
	// gives up on a message only when it tries to deliver it again: when
	// AckWait runs out, it tries that request, gives up on every message
	// and says so in its advisories, with nobody listening.
	dead, err := e.nc.SubscribeSync("_INBOX.dead")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+jsinbox.DefaultStream+".ledger", dead.Subject,
		[]byte(`{"batch":100,"expires":10000000000}`)); err != nil {
		t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Nobody runs until the server has given up on every message: its
	// advisories are all sent.
	adv, err := e.js.Stream(ctx, jsinbox.AdvisoryStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		info, err := adv.Info(ctx)
		return err == nil && info.State.Msgs == n
	})
	// The server drops a request nobody can receive: the dead client's
	// subscription stayed until now, as a hung process's does.
	if err := dead.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	// verify sees them waiting for their rescue, not lost: their
	// advisories are stored and nobody has settled them.
	if rep := e.verify(t); rep.AwaitingRescue != n || rep.Lost != 0 {
		t.Fatalf("before the rescue: awaiting rescue %d, lost %d; want %d awaiting and none lost", rep.AwaitingRescue, rep.Lost, n)
	}
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 100})
	waitFor(t, 30*time.Second, func() bool {
		var applied int
		return e.pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE status = 'applied'`).Scan(&applied) == nil && applied == n
	})
	e.assertClean(t, n)
	if s := r.c.Stats(); s.Rescued == 0 {
		t.Fatalf("stats %+v: nothing was rescued", s)
	}
}

// TestRejectedIDRepublished: an intent rejected and dead-lettered once and
// published again after the duplicate window (a new stream message with
// the same ID, subject and payload) is terminated as a copy of the rejected
// intent: one dead letter, not two, and verify counts the copy as settled.
// The same ID and payload on another subject is another intent: a
// conflict, dead-lettered as such.
func TestRejectedIDRepublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{DuplicateWindow: 100 * time.Millisecond})
	poison := []byte(`{"account":1,"amount":"five"}`)
	e.publish(t, load(10, "rep"))
	e.publishRaw(t, "intents.1", "rejected-once", poison)
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 50})
	e.settle(t, 30*time.Second)
	time.Sleep(200 * time.Millisecond) // past the duplicate window
	e.publishRaw(t, "intents.1", "rejected-once", poison)
	time.Sleep(200 * time.Millisecond)
	e.publishRaw(t, "intents.1", "rejected-once", poison)
	time.Sleep(200 * time.Millisecond)
	e.publishRaw(t, "intents.2", "rejected-once", poison)
	e.settle(t, 30*time.Second)
	waitFor(t, 10*time.Second, func() bool { return r.c.Stats().RejectedRepeats == 2 && r.c.Stats().Conflicts == 1 })
	if s := r.c.Stats(); s.DeadLettered != 2 {
		t.Fatalf("stats %+v: want one dead letter for the rejected intent, one for the conflict", s)
	}
	if n := len(deadLetters(t, e)); n != 2 {
		t.Fatalf("%d dead letters, want 2", n)
	}
	e.assertClean(t, 10)
}

// TestUnstorableSubjectIsolated: a subject that is not valid UTF-8 cannot
// be stored as text. It used to fail the claim of the whole batch on every
// delivery, burning its neighbours' delivery budget. It is rejected alone,
// on its first delivery.
func TestUnstorableSubjectIsolated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	good := load(200, "subj")
	e.publish(t, good[:100])
	e.publishRaw(t, "intents.\xff\xfe", "bad-subject", []byte(`{"account":1,"amount":5}`))
	e.publish(t, good[100:])
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 500})
	e.settle(t, 30*time.Second)
	e.assertClean(t, 200)
	if s := r.c.Stats(); s.DeadLettered != 1 || s.Naks != 0 || s.Redeliveries != 0 || s.FailedBatches != 0 {
		t.Fatalf("stats %+v: want one dead letter and no retried delivery", s)
	}
	if d := deadLetters(t, e); len(d) != 1 || !strings.Contains(d[0].Header[jsinbox.HeaderReason], "invalid subject") {
		t.Fatalf("dead letters %+v", d)
	}
}

// TestRefusedClaimIsolated: a claim the database refuses for one message
// (here a constraint an operator added; in general any data error the
// checks before the claim miss) rejects that message alone, on its first
// delivery, on the COPY path and on the conflict-checking one.
func TestRefusedClaimIsolated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		size int
	}{{"copy", 500}, {"claim", 32}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, "", jsinbox.StreamConfig{})
			if _, err := e.pool.Exec(ctx, `ALTER TABLE inbox ADD CONSTRAINT refuse_one CHECK (subject <> 'intents.refused')`); err != nil {
				t.Fatal(err)
			}
			good := load(100, "refuse")
			e.publish(t, good[:50])
			e.publishRaw(t, "intents.refused", "refused", []byte(`{"account":1,"amount":5}`))
			e.publish(t, good[50:])
			r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: tc.size})
			e.settle(t, 30*time.Second)
			e.assertClean(t, 100)
			if s := r.c.Stats(); s.DeadLettered != 1 || s.Naks != 0 || s.Redeliveries != 0 {
				t.Fatalf("stats %+v: want one dead letter and no retried delivery", s)
			}
			if d := deadLetters(t, e); len(d) != 1 || !strings.Contains(d[0].Header[jsinbox.HeaderReason], "refused the claim") {
				t.Fatalf("dead letters %+v", d)
			}
		})
	}
}

// TestNotReadyWithoutNATS: the consumer is not ready while its NATS
// connection is down, and ready again once it is back.
func TestNotReadyWithoutNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 50})
	waitFor(t, 10*time.Second, r.c.Ready)
	e.nats.Shutdown()
	waitFor(t, 2*time.Second, func() bool { return !r.c.Ready() })
	if err := e.nats.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, r.c.Ready)
}

// TestEnsureStreamAllOrNothing: when the servers have no room for the
// intents stream, EnsureStream fails without leaving the dead-letter and
// advisory streams it created behind; with sizes that fit, it creates all
// three.
func TestEnsureStreamAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{Configure: func(o *server.Options) { o.JetStreamMaxStore = 6 << 30 }})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{}); err == nil {
		t.Fatal("a 16 GiB stream fit in 6 GiB of storage: the test exercises nothing")
	}
	for _, name := range []string{jsinbox.DefaultStream, jsinbox.DeadLetterStream(jsinbox.DefaultStream), jsinbox.AdvisoryStream(jsinbox.DefaultStream)} {
		if _, err := js.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("stream %s after a failed EnsureStream: %v, want not found", name, err)
		}
	}
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{MaxBytes: 512 << 20, DeadLetterMaxBytes: 256 << 20}); err != nil {
		t.Fatalf("sizes that fit: %v", err)
	}
	dlq, err := js.Stream(ctx, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	if err != nil || dlq.CachedInfo().Config.MaxBytes != 256<<20 {
		t.Fatalf("dead-letter stream %v, %v: want MaxBytes 256 MiB", dlq, err)
	}
}

// TestDurableDeletedUnderTheConsumer: the server deletes the durable while
// a consumer pulls from it (an operator's `nats consumer rm`, or a cluster
// that lost the consumer). The client ends the pull subscription on the
// "consumer deleted" status; the consumer must notice, bind the durable
// again (creating it, as it may here) and apply what is published after,
// not wait forever on a subscription that will never deliver again.
func TestDurableDeletedUnderTheConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	intents := load(400, "deleted")
	e.publish(t, intents[:200])
	var logs testenv.SyncBuffer
	e.logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 50, AckWait: 3 * time.Second})
	defer func() {
		if t.Failed() {
			t.Logf("consumer log:\n%s", logs.String())
		}
	}()
	e.settle(t, time.Minute)
	if err := e.js.DeleteConsumer(context.Background(), jsinbox.DefaultStream, "ledger"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the status reaches the client
	e.publish(t, intents[200:])
	deadline := time.Now().Add(30 * time.Second)
	for r.c.Stats().Applied < 400 {
		if time.Now().After(deadline) {
			t.Fatalf("after the durable was deleted the consumer applied %d of 400 in 30 s: it stopped pulling", r.c.Stats().Applied)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.settle(t, time.Minute)
	// The re-created durable delivers the first 200 again and the inbox
	// finds them applied: none is applied twice. Not all of them need come
	// back to this consumer: a pull request the old subscription sent just
	// before the deletion can reach the new durable, which then delivers
	// the first messages to a subscription that is gone (they come back
	// after AckWait), and acks of the first life that the server handles
	// late settle some of them (their effects committed before those acks
	// were sent).
	e.assertClean(t, 400)
	if s := r.c.Stats(); s.Applied != 400 || s.Received != 400+s.Duplicates {
		t.Fatalf("stats %+v: want 400 applied once, every other delivery a duplicate", s)
	}
}
