package jsinboxtest

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
)

// giveUpUnattended makes the server give up on every message of the
// stream after one delivery that nobody settles, as a consumer that dies
// on a last delivery does, with no consumer running: their max-deliveries
// advisories wait in the advisory stream. It returns when the server has
// given up on n messages.
func giveUpUnattended(t *testing.T, e *env, n int) {
	t.Helper()
	ctx := context.Background()
	cons, err := e.js.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{Durable: "ledger",
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 1, AckWait: time.Second, MaxAckPending: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for got := 0; got < n; {
		b, err := cons.Fetch(n-got, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range b.Messages() {
			got++
		}
	}
	// The server gives up on a message when it would deliver it again: a
	// pull request left waiting makes it try once AckWait has run out.
	dead, err := e.nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+jsinbox.DefaultStream+".ledger", dead.Subject,
		[]byte(`{"batch":100,"expires":10000000000}`)); err != nil {
		t.Fatal(err)
	}
	adv, err := e.js.Stream(ctx, jsinbox.AdvisoryStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		info, err := adv.Info(ctx)
		return err == nil && info.State.Msgs == uint64(n)
	})
	if err := dead.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
}

// TestGivenUpMessageAgedOutIsRecorded: the server gives up on messages
// while no consumer runs, and they age out of the intents stream (max_age)
// before any consumer rescues them. The rescue cannot apply them; it
// counts each, records it in the dead-letter stream as expired (no
// payload, the stream and sequence in its headers), and verify reports
// them as a violation of their own kind, not as dead letters.
func TestGivenUpMessageAgedOutIsRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const maxAge = 3 * time.Second
	e := newEnv(t, "", jsinbox.StreamConfig{MaxAge: maxAge, DuplicateWindow: time.Second})
	const n = 3
	e.publish(t, load(n, "aged"))
	giveUpUnattended(t, e, n)
	intents, err := e.js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*maxAge, func() bool {
		info, err := intents.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})

	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 10})
	waitFor(t, 30*time.Second, func() bool { return r.c.Stats().RescueExpired == n })
	if s := r.c.Stats(); s.Rescued != 0 || s.DeadLettered != 0 || s.ForeignAdvisories != 0 {
		t.Fatalf("stats %+v: want %d expired and nothing rescued, dead-lettered or refused", s, n)
	}

	dead := deadLetters(t, e)
	if len(dead) != n {
		t.Fatalf("%d records in the dead-letter stream, want %d", len(dead), n)
	}
	// One per sequence, in the order the server gave up on them.
	seqs := map[string]bool{}
	for i, d := range dead {
		h := d.Header
		seq := h[jsinbox.HeaderStreamSeq]
		if h[jsinbox.HeaderStatus] != jsinbox.DeadLetterExpired || h[jsinbox.HeaderStream] != jsinbox.DefaultStream ||
			h[jsinbox.HeaderScope] != "ledger" || h[jsinbox.HeaderDelivered] != "1" || len(d.Payload) != 0 ||
			d.ID != "ledger:"+jsinbox.DefaultStream+":"+seq || seqs[seq] {
			t.Fatalf("record %d: id %q, headers %v, payload %q", i, d.ID, h, d.Payload)
		}
		seqs[seq] = true
	}
	for i := 1; i <= n; i++ {
		if !seqs[fmt.Sprint(i)] {
			t.Fatalf("no expired record for stream seq %d: %v", i, seqs)
		}
	}

	rep := e.verify(t)
	var b strings.Builder
	rep.WriteTable(&b)
	if rep.Clean() || rep.ExpiredBeforeRescue != n || rep.DeadLettered != 0 || rep.ViolationCount() != n ||
		rep.Violations()[verify.KindExpiredBeforeRescue] != n || !strings.Contains(b.String(), "expired before rescue") {
		t.Fatalf("verify after %d messages aged out before their rescue:\n%s", n, b.String())
	}
	t.Logf("verify:\n%s", b.String())

	// verify -watch checks from its checkpoint up to the durable's ack
	// floor, which the aged-out messages hold down for good; the sequences
	// it reports expired are below the stream's first one now, and count
	// all the same.
	w, err := verify.NewWatch(e.js, e.pool, verify.Options{Scope: "ledger", Durable: "ledger"}, "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		_, err := w.Round(ctx)
		if err != nil {
			t.Logf("verify -watch round: %v", err)
		}
		return err == nil && w.Checkpoint().Violations[verify.KindExpiredBeforeRescue] == n
	})
}

// TestRescueRefusesForgedAdvisories: NATS does not check reply subjects
// against permissions, so a key that may make JetStream requests can have
// the server store its answers in the advisory stream; an admin can
// publish there too. None of these may make the rescue read back, apply
// or dead-letter a message: garbage, a STREAM.INFO answer, an advisory
// without the max_deliver type or for another consumer, one naming a
// message the stream never held, and the answer to a direct get of an
// intent whose payload is a perfect advisory (headers and all). Each is
// terminated and counted; the victim, an intent outside the durable's
// filter, is never applied.
func TestRescueRefusesForgedAdvisories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	s, err := e.js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowDirect = true
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	intent := effects.Intent{Account: 1, Amount: 5}.AppendJSON(nil)
	e.publishRaw(t, "intents.1", "kept", intent)   // seq 1: the durable's
	e.publishRaw(t, "intents.2", "victim", intent) // seq 2: outside its filter
	advisory := func(typ, consumer string, seq int) []byte {
		return fmt.Appendf(nil, `{"type":%q,"id":"forged","timestamp":"2026-01-01T00:00:00Z","stream":%q,"consumer":%q,"stream_seq":%d,"deliveries":20}`,
			typ, jsinbox.DefaultStream, consumer, seq)
	}
	const maxDeliver = "io.nats.jetstream.advisory.v1.max_deliver"
	e.publishRaw(t, "intents.3", "carrier", advisory(maxDeliver, "ledger", 2)) // seq 3

	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{FilterSubjects: []string{"intents.1"}})
	waitFor(t, 30*time.Second, func() bool { return r.c.Stats().Applied == 1 })

	subject := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + jsinbox.DefaultStream + ".ledger"
	forged := [][]byte{
		[]byte("garbage"),
		advisory("", "ledger", 2),
		advisory(maxDeliver, "someone-else", 2),
		advisory(maxDeliver, "ledger", 1000),
	}
	for _, f := range forged {
		if err := e.nc.Publish(subject, f); err != nil {
			t.Fatal(err)
		}
	}
	// Answers the server sends to a reply subject nobody checks.
	if err := e.nc.PublishRequest("$JS.API.STREAM.INFO."+jsinbox.DefaultStream, subject, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.nc.PublishRequest("$JS.API.DIRECT.GET."+jsinbox.DefaultStream, subject, []byte(`{"seq":3}`)); err != nil {
		t.Fatal(err)
	}
	const n = 6
	adv, err := e.js.Consumer(ctx, jsinbox.AdvisoryStream(jsinbox.DefaultStream), "ledger")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		info, err := adv.Info(ctx)
		return err == nil && info.Delivered.Stream == n && info.NumPending == 0 && info.NumAckPending == 0
	})
	var victim int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE message_id = 'victim'`).Scan(&victim); err != nil {
		t.Fatal(err)
	}
	if s := r.c.Stats(); victim != 0 || s.Rescued != 0 || s.DeadLettered != 0 || s.ForeignAdvisories != n {
		t.Fatalf("after %d forged advisories: %d inbox rows for the victim, stats %+v; want none, all %d counted as foreign", n, victim, s, n)
	}
}

// TestExpiredButAppliedIsNoViolation: a consumer commits messages on
// their last delivery and dies before its acks reach the server (here:
// the inbox applies them, nobody acks), the server gives up on them, and
// they age out of the stream before any consumer rescues them. The rescue
// records each as expired, as it must (it cannot read them back), but the
// inbox rows those messages made name their stream sequences: verify
// finds them applied, and counts only the one never applied as a
// violation, with no row or effect of the others taken for unexpected and
// the balances right.
func TestExpiredButAppliedIsNoViolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const maxAge = 3 * time.Second
	e := newEnv(t, "", jsinbox.StreamConfig{MaxAge: maxAge, DuplicateWindow: time.Second})
	const n = 3
	e.publish(t, load(n, "lostack"))
	// Applied, as a consumer would on the last delivery; the acks are lost.
	intents, err := e.js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	proc, err := inbox.NewProcessor(pginbox.New(e.pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []inbox.Message
	for seq := uint64(1); seq < n; seq++ {
		raw, err := intents.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, inbox.Message{ID: raw.Header.Get(jetstream.MsgIDHeader), Payload: raw.Data, Subject: raw.Subject, StreamSeq: seq, Deliveries: 1, Final: true})
	}
	out, err := proc.Process(ctx, msgs)
	if err != nil || out[0].Status != inbox.StatusApplied || out[1].Status != inbox.StatusApplied {
		t.Fatalf("applying %d of the messages: %v %+v", len(msgs), err, out)
	}
	giveUpUnattended(t, e, n)
	waitFor(t, 3*maxAge, func() bool {
		info, err := intents.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 10})
	waitFor(t, 30*time.Second, func() bool { return r.c.Stats().RescueExpired == n })

	rep := e.verify(t)
	var b strings.Builder
	rep.WriteTable(&b)
	t.Logf("verify:\n%s", b.String())
	if rep.ExpiredBeforeRescue != 1 || rep.ExpiredApplied != n-1 || rep.ViolationCount() != 1 ||
		rep.Unexpected != 0 || rep.BalanceMismatches != 0 || rep.AppliedOnce != n-1 {
		t.Fatalf("verify after %d applied messages and 1 unapplied aged out before their rescue: want 1 expired violation, %d found applied, nothing else:\n%s",
			n-1, n-1, b.String())
	}
}

// rescueN is how many give-ups TestRescueSettlesGiveUpsInBatches makes:
// a few hundred by default, thousands to measure the rescue's rate
// (go test -run TestRescueSettlesGiveUpsInBatches ./inbox/jsinbox -args -rescue-n 12000).
var rescueN = flag.Int("rescue-n", 300, "give-ups TestRescueSettlesGiveUpsInBatches rescues")

// countingProc counts the transactions a consumer runs through its
// processor.
type countingProc struct {
	*inbox.Processor[pgx.Tx]
	calls, msgs atomic.Int64
}

func (p *countingProc) Process(ctx context.Context, msgs []inbox.Message) ([]inbox.Outcome, error) {
	p.calls.Add(1)
	p.msgs.Add(int64(len(msgs)))
	return p.Processor.Process(ctx, msgs)
}

// TestRescueSettlesGiveUpsInBatches: a consumer killed with a large batch
// on its final delivery leaves a give-up per message; the next consumer
// rescues them in batches through the processor (many advisories, their
// messages read back together, one transaction each batch), not one
// message per transaction, and the pipeline ends clean with every one
// applied once. It logs the rate.
func TestRescueSettlesGiveUpsInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := *rescueN
	e := newEnv(t, "", jsinbox.StreamConfig{})
	e.publish(t, load(n, "giveup"))
	giveUpUnattended(t, e, n)

	inner, err := inbox.NewProcessor(pginbox.New(e.pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	proc := &countingProc{Processor: inner}
	c, err := jsinbox.NewConsumer(e.js, proc, jsinbox.ConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	waitFor(t, 5*time.Minute, func() bool { return c.Stats().Rescued >= int64(n) })
	took := time.Since(start)
	calls := proc.calls.Load()
	t.Logf("rescued %d give-ups in %v: %.0f a second, in %d transactions", n, took.Round(time.Millisecond), float64(n)/took.Seconds(), calls)
	if s := c.Stats(); s.Rescued != int64(n) || s.DeadLettered != 0 || s.ForeignAdvisories != 0 {
		t.Fatalf("stats %+v: want %d rescued, nothing dead-lettered or refused", s, n)
	}
	// Batches are what has arrived when one starts: a loaded machine may
	// cut them smaller, never to one message each.
	if calls > int64(n/5) {
		t.Fatalf("%d give-ups rescued in %d transactions: want batches (at most %d transactions)", n, calls, n/5)
	}
	e.settle(t, 30*time.Second)
	e.assertClean(t, n)
}

// failingProc is a processor whose every transaction fails, as on a
// database that does not answer: a rescue naks its advisories.
type failingProc struct{ *inbox.Processor[pgx.Tx] }

func (failingProc) Process(context.Context, []inbox.Message) ([]inbox.Outcome, error) {
	return nil, fmt.Errorf("database unreachable (test)")
}

// TestVerifyCountsAwaitingRescue: messages the server gave up on, whose
// advisories wait in the advisory stream unsettled, are neither applied
// nor dead-lettered yet, but they are not lost: verify counts them as
// awaiting rescue (no violation, exit 0) while no consumer has run since
// and while a consumer's rescue cannot settle them; once one can, they
// are applied and verify is clean with none awaiting.
func TestVerifyCountsAwaitingRescue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	const n = 6
	e.publish(t, load(n, "await"))
	giveUpUnattended(t, e, n)
	check := func(when string, want int) {
		t.Helper()
		rep := e.verify(t)
		var b strings.Builder
		rep.WriteTable(&b)
		if !rep.Clean() || rep.Lost != 0 || rep.AwaitingRescue != want || (want > 0) != !rep.AwaitingRescueSince.IsZero() ||
			(want > 0) != strings.Contains(b.String(), "await their rescue") {
			t.Fatalf("verify %s: want clean with %d awaiting rescue, none lost:\n%s", when, want, b.String())
		}
		t.Logf("verify %s:\n%s", when, b.String())
	}
	check("with no consumer run since the give-ups", n)

	inner, err := inbox.NewProcessor(pginbox.New(e.pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := jsinbox.NewConsumer(e.js, failingProc{inner}, jsinbox.ConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	waitFor(t, 30*time.Second, c.Ready)
	// The rescue durable exists now and has delivered and naked them.
	adv, err := e.js.Consumer(ctx, jsinbox.AdvisoryStream(jsinbox.DefaultStream), "ledger")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		info, err := adv.Info(ctx)
		return err == nil && info.Delivered.Stream == n
	})
	check("while the rescue cannot settle", n)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{})
	waitFor(t, 30*time.Second, func() bool { return r.c.Stats().Rescued == n })
	waitFor(t, 30*time.Second, func() bool {
		info, err := adv.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	check("after the rescue", 0)
	e.assertClean(t, n)
}

// TestRescueWaitsOutAStaleRead: the rescue reads given-up messages back
// with direct gets, which any server holding the stream may answer: a
// replica, or a mirror that allows direct gets, behind the leader answers
// "not found" for a message the stream holds. Here a mirror that keeps
// only another subject, so it never holds the messages given up on,
// answers a share of the rescue's reads. None of those messages may be
// recorded as expired (its intent would never be applied): the rescue
// leaves their advisories unsettled, counts the stale reads, tries again
// after a backoff and applies every one once.
func TestRescueWaitsOutAStaleRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	// The mirror answers direct gets of the intents stream once it has
	// caught up, which it does on the one message it keeps.
	e.publish(t, pipeline.Generate(pipeline.Load{Count: 1, Accounts: accounts, Prefix: "marker", Subject: "intents.marker", Seed: 2}))
	mirror, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "INTENTS_STALE", Storage: jetstream.MemoryStorage,
		Mirror: &jetstream.StreamSource{Name: jsinbox.DefaultStream, FilterSubject: "intents.marker.>"}, MirrorDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		info, err := mirror.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
	const n = 20
	e.publish(t, load(n, "stale"))
	giveUpUnattended(t, e, n+1)

	// Short backoffs: a retried read goes to the mirror half the time.
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{Nak: jitter.Policy{Kind: jitter.Decorrelated, Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}})
	waitFor(t, time.Minute, func() bool {
		s := r.c.Stats()
		return s.Rescued+s.RescueExpired+s.ForeignAdvisories >= n+1
	})
	s := r.c.Stats()
	if s.Rescued != n+1 || s.RescueExpired != 0 || s.ForeignAdvisories != 0 || s.DeadLettered != 0 {
		t.Fatalf("stats %+v: want all %d rescued, none recorded expired (a stale read is no proof a message is gone)", s, n+1)
	}
	if s.RescueStaleReads == 0 {
		t.Fatalf("stats %+v: no stale read counted; the mirror answered none of %d reads, so this test proved nothing", s, n+1)
	}
	t.Logf("%d stale reads waited out", s.RescueStaleReads)
	if dead := deadLetters(t, e); len(dead) != 0 {
		t.Fatalf("%d records in the dead-letter stream, want none: %+v", len(dead), dead[0])
	}
	// verify reads with direct gets too: without the mirror, it reads
	// what the stream holds.
	if err := e.js.DeleteStream(ctx, "INTENTS_STALE"); err != nil {
		t.Fatal(err)
	}
	e.settle(t, 30*time.Second)
	e.assertClean(t, n+1)
}
