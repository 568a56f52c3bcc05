package deploy_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
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
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
)

// TestProjectUnderShippedRoles runs jetinbox's own producer and consumer
// (jsinbox.EnsureStream and Publisher, jsinbox.NewConsumer and Run, as
// cmd/producer and cmd/consumer do) against the shipped deployment: an R3
// cluster from deploy/nats with the shipped auth.conf, the streams and
// consumers from deploy/jetstream, and a PostgreSQL set up from
// deploy/postgres. Each runs under its own role and must be refused
// nothing:
//
//   - the producer checks the streams, publishes intents (each pinned to
//     INTENTS with Nats-Expected-Stream), reads a duplicate back and reports
//     a reused ID as a conflict;
//   - the consumer starts, applies what was published (each credit adding
//     its notification to the outbox, as with -follow-ups), dead-letters a
//     poison intent, and rescues an intent the server gave up on after
//     max_deliver while no consumer ran, from the advisory the server sent
//     then and INTENTS_ADVISORIES kept;
//   - the relay (jetinbox relay's own code, as jetinbox_relay) publishes the
//     notifications to NOTIFICATIONS and marks them sent, and publishes a
//     row again after a relay that "died" before marking it: the stream
//     reports a duplicate, which it reads back and finds the same.
//
// An admin subscription records what each role publishes: every subject
// its permissions allow must be one it uses ($JS.API.INFO aside), so the
// lists grow and shrink with the client calls, not with guesses.
func TestProjectUnderShippedRoles(t *testing.T) {
	t.Parallel()
	fsys := loadFiles(t)
	fx := fixture(t)
	defs, err := loadJetStream(fsys)
	if err != nil {
		t.Fatal(err)
	}
	dsns := provisionPostgres(t, fx)
	consumerDSN := dsns["jetinbox_consumer"]
	urls := startNATSCluster(t, fsys, fx)
	// Every client on one server, so that what a role published has reached
	// the recorder once both connections have flushed.
	one, _, _ := strings.Cut(urls, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	admin := connectAs(t, one, fx, "admin")
	adminJS, err := jetstream.New(admin.nc)
	if err != nil {
		t.Fatal(err)
	}
	intents := applyJetStream(t, ctx, adminJS, defs)
	stream, durable := defs.intents.Name, defs.ledger.Durable

	// The server gives up on an intent while no consumer runs: an admin
	// client takes each of its max_deliver deliveries and naks it, as a
	// consumer would that fails it every time and dies before it can
	// dead-letter it. Nobody hears the advisory; the advisory stream keeps
	// it.
	givenUp, err := adminJS.Publish(ctx, "intents.ledger", []byte(`{"account":2,"amount":7}`), jetstream.WithMsgID("given-up"))
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := adminJS.Consumer(ctx, stream, durable)
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= defs.ledger.MaxDeliver; n++ {
		m := fetchOne(t, ledger, 5*time.Second)
		if m == nil {
			t.Fatalf("delivery %d of %d did not come", n, defs.ledger.MaxDeliver)
		}
		md, err := m.Metadata()
		if err != nil || md.NumDelivered != uint64(n) || md.Sequence.Stream != givenUp.Sequence {
			t.Fatalf("delivery %d: %+v, %v", n, md, err)
		}
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
	}
	// The server gives up on a nak'ed last delivery when it tries to
	// deliver the message again, that is with a pull request waiting.
	if m := fetchOne(t, ledger, time.Second); m != nil {
		t.Fatalf("delivered after max_deliver: %+v", m.Headers())
	}
	adv, err := adminJS.Stream(ctx, defs.advisories.Name)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, func() error {
		info, err := adv.Info(ctx)
		if err == nil && info.State.Msgs != 1 {
			err = fmt.Errorf("%s holds %d advisories, want 1", defs.advisories.Name, info.State.Msgs)
		}
		return err
	})
	if ci, err := ledger.Info(ctx); err != nil || ci.NumAckPending != 0 || ci.NumPending != 0 {
		t.Fatalf("the durable still holds the message it gave up on: %+v, %v", ci, err)
	}

	if !t.Run("producer", func(t *testing.T) {
		rec := startRecording(t, admin.nc)
		producer := connectAs(t, one, fx, "producer")
		js, err := jetstream.New(producer.nc)
		if err != nil {
			t.Fatal(err)
		}
		// What cmd/producer does before it publishes. A call the role may
		// not make gets no answer: give up long before the test's deadline.
		ectx, ecancel := context.WithTimeout(ctx, 15*time.Second)
		defer ecancel()
		if _, err := jsinbox.EnsureStream(ectx, js, jsinbox.StreamConfig{Name: stream, Subjects: defs.intents.Subjects, Replicas: defs.intents.Replicas}); err != nil {
			t.Fatalf("EnsureStream under the producer role: %v", err)
		}
		publish := func(intents ...inbox.Intent) (jsinbox.PublisherStats, []jsinbox.Failure) {
			t.Helper()
			pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{Stream: stream})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			for _, in := range intents {
				if err := pub.PublishAsync(ctx, in); err != nil {
					t.Fatal(err)
				}
			}
			if err := pub.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			return pub.Stats(), pub.Failures()
		}
		var batch []inbox.Intent
		for i := 1; i <= 5; i++ {
			batch = append(batch, inbox.Intent{ID: fmt.Sprintf("ledger-%d", i), Subject: "intents.ledger", Payload: fmt.Appendf(nil, `{"account":1,"amount":%d}`, i)})
		}
		batch = append(batch, inbox.Intent{ID: "poison", Subject: "intents.ledger", Payload: []byte(`{"account":1,"amount":"five"}`)})
		if st, f := publish(batch...); st.Published != 6 || len(f) > 0 {
			t.Fatalf("publish: %+v, failures %+v", st, f)
		}
		// A retry is a duplicate, read back and found the same; a reused ID
		// with another payload is a conflict, not a success.
		reused := inbox.Intent{ID: "ledger-2", Subject: "intents.ledger", Payload: []byte(`{"account":1,"amount":200}`)}
		st, f := publish(batch[0], reused)
		if st.Duplicates != 1 || st.Conflicts != 1 || len(f) != 1 || f[0].ID != "ledger-2" || !errors.Is(f[0].Err, inbox.ErrConflict) {
			t.Fatalf("duplicate and conflict: %+v, failures %+v", st, f)
		}
		producer.expectNoAsyncError(t)
		producer.nc.Close()
		rec.check(t, "producer", producerPublish)

		// Each intent was pinned to its stream.
		m, err := intents.GetMsg(ctx, givenUp.Sequence+1)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(jetstream.MsgIDHeader) != "ledger-1" || m.Header.Get(jetstream.ExpectedStreamHeader) != stream {
			t.Fatalf("stored intent headers %v, want %s ledger-1 and %s %s", m.Header, jetstream.MsgIDHeader, jetstream.ExpectedStreamHeader, stream)
		}
	}) {
		return // the consumer has nothing to consume
	}

	t.Run("consumer", func(t *testing.T) {
		rec := startRecording(t, admin.nc)
		// The consumer's pull requests name the reply subject its intents
		// are delivered on.
		pulls, err := admin.nc.SubscribeSync("$JS.API.CONSUMER.MSG.NEXT." + stream + "." + durable)
		if err != nil {
			t.Fatal(err)
		}
		defer pulls.Unsubscribe()
		if err := admin.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		consumer := connectAs(t, one, fx, "consumer")
		c, _ := projectConsumer(t, ctx, consumer, consumerDSN, stream, durable)
		runCtx, stop := context.WithCancel(context.Background())
		defer stop()
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		var ready bool
		eventually(t, ctx, func() error {
			ready = ready || c.Ready()
			select {
			case err := <-done:
				t.Fatalf("the consumer stopped: %v", err)
			default:
			}
			if s := c.Stats(); !ready || s.Applied != 5 || s.DeadLettered != 1 || s.Rescued != 1 {
				return fmt.Errorf("ready %v, stats %+v: want 5 applied, 1 dead-lettered, 1 rescued", ready, s)
			}
			return nil
		})
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("Run did not return after its context ended")
		}
		consumer.expectNoAsyncError(t)
		consumer.nc.Close()
		rec.check(t, "consumer", consumerPublish)

		// The producer's user may not listen where the consumer's intents
		// arrive: not on the consumer's delivery subject, not under its
		// prefix, not on the shared default prefix.
		pull, err := pulls.NextMsg(time.Second)
		if err != nil {
			t.Fatalf("no pull request of the consumer recorded: %v", err)
		}
		if !strings.HasPrefix(pull.Reply, inboxPrefix["consumer"]+".") {
			t.Errorf("the consumer pulls with reply subject %q, want it under its own prefix %s", pull.Reply, inboxPrefix["consumer"])
		}
		spy := connectAs(t, one, fx, "producer")
		for _, subj := range []string{pull.Reply, inboxPrefix["consumer"] + ".>", "_INBOX.>", ">"} {
			spy.expectSubscribeDenied(t, subj)
		}

		// The effects: the rescued intent applied once, the poison rejected.
		// Read as the verifier: the consumer cannot read the ledger back.
		pool, err := pgxpool.New(ctx, dsns["jetinbox_verifier"])
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var applied, rejected, entries, balance int
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'applied'), count(*) FILTER (WHERE status = 'rejected') FROM inbox WHERE scope = $1`, durable).Scan(&applied, &rejected); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE message_id = 'given-up'`).Scan(&entries); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 2`).Scan(&balance); err != nil {
			t.Fatal(err)
		}
		if applied != 6 || rejected != 1 || entries != 1 || balance != 7 {
			t.Fatalf("inbox %d applied, %d rejected; %d entries for the rescued intent, account 2 at %d: want 6, 1, 1, 7", applied, rejected, entries, balance)
		}
		// Nothing left behind: the advisory is settled, the durable done.
		rescue, err := adv.Consumer(ctx, defs.rescue.Durable)
		if err != nil {
			t.Fatal(err)
		}
		for _, cons := range []jetstream.Consumer{rescue, ledger} {
			ci, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if ci.NumAckPending != 0 || ci.NumPending != 0 {
				t.Errorf("%s/%s: ack pending %d, pending %d: want nothing pending", ci.Stream, ci.Name, ci.NumAckPending, ci.NumPending)
			}
		}
		// The dead letter is pinned to the dead-letter stream and carries no
		// JetStream header of the original.
		// (Read with STREAM.MSG.GET: a direct get adds headers of its own.)
		dl, err := msgGet(ctx, admin.nc, defs.dlq.Name, 1)
		if err != nil {
			t.Fatal(err)
		}
		if dl.Subject != "dlq.intents.ledger" || dl.Header.Get(jsinbox.HeaderMessageID) != "poison" || dl.Header.Get(jsinbox.HeaderReason) == "" ||
			dl.Header.Get(jetstream.ExpectedStreamHeader) != defs.dlq.Name {
			t.Errorf("dead letter %s %v", dl.Subject, dl.Header)
		}
		for k := range dl.Header {
			if strings.HasPrefix(strings.ToLower(k), "nats-") && k != jetstream.MsgIDHeader && k != jetstream.ExpectedStreamHeader {
				t.Errorf("dead letter carries %s: %v", k, dl.Header)
			}
		}
		if id := dl.Header.Get(jetstream.MsgIDHeader); id == "" || id == "poison" {
			t.Errorf("dead letter ID %q: want its own, not the original's", id)
		}
	})

	// The relay (what jetinbox relay runs: the outbox schema and the target
	// stream checked, then outbox.Relay) under its own NATS user and
	// database role: it
	// publishes the consumer's notifications, is refused nothing, and uses
	// every subject its permissions allow.
	t.Run("relay", func(t *testing.T) {
		rec := startRecording(t, admin.nc)
		relay := connectAs(t, one, fx, "relay")
		js, err := jetstream.New(relay.nc)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, dsns["jetinbox_relay"])
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		migrator, err := pgxpool.New(ctx, dsns["jetinbox_migrator"])
		if err != nil {
			t.Fatal(err)
		}
		defer migrator.Close()
		pending := func() int {
			t.Helper()
			var n int
			if err := migrator.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE sent_at IS NULL AND failed IS NULL`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := pending(); n != 6 {
			t.Fatalf("%d outbox rows pending, want the 6 notifications of the applied intents", n)
		}
		logs := &testenv.SyncBuffer{}
		log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		defer func() {
			if t.Failed() {
				t.Logf("relay log:\n%s", logs.String())
			}
		}()
		if err := pginbox.New(pool).Outbox().CheckSchema(ctx); err != nil {
			t.Fatalf("the outbox schema check as jetinbox_relay: %v", err)
		}
		if _, err := js.Stream(ctx, defs.notifications.Name); err != nil {
			t.Fatalf("looking %s up as the relay: %v", defs.notifications.Name, err)
		}
		r, err := outbox.NewRelay(pginbox.New(pool).Outbox(), js, outbox.RelayConfig{Stream: defs.notifications.Name, Logger: log,
			Idle: jitter.Policy{Kind: jitter.Decorrelated, Base: 50 * time.Millisecond, Cap: 200 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(context.Background())
		defer stop()
		done := make(chan error, 1)
		go func() { done <- r.Run(runCtx) }()
		eventually(t, ctx, func() error {
			if n := pending(); n > 0 {
				return fmt.Errorf("%d rows pending", n)
			}
			return nil
		})
		// A relay that died after the PubAck, before the mark: the row is
		// pending again and goes out again with the same ID. (A sent row
		// stays sent for every role: only the owner, turning the guard
		// off, can stage this.)
		if _, err := migrator.Exec(ctx, `BEGIN; ALTER TABLE outbox DISABLE TRIGGER outbox_sent_stays; `+
			`UPDATE outbox SET sent_at = NULL WHERE id = 'notify:ledger-1'; ALTER TABLE outbox ENABLE TRIGGER outbox_sent_stays; COMMIT`); err != nil {
			t.Fatal(err)
		}
		eventually(t, ctx, func() error {
			if n, d := pending(), r.Stats().Duplicates; n > 0 || d != 1 {
				return fmt.Errorf("%d rows pending, %d duplicates", n, d)
			}
			return nil
		})
		stop()
		if err := <-done; err != nil {
			t.Fatalf("relay Run: %v", err)
		}
		if s := r.Stats(); s.Sent != 7 || s.Duplicates != 1 || s.Failed != 0 {
			t.Fatalf("relay stats %+v: want 7 sent, 1 of them a duplicate, none failed", s)
		}
		relay.expectNoAsyncError(t)
		relay.nc.Close()
		rec.check(t, "relay", relayPublish)

		// Every notification once in NOTIFICATIONS, pinned there; the
		// chain check, as the verifier, is clean.
		notes, err := adminJS.Stream(ctx, defs.notifications.Name)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := notes.Info(ctx); err != nil || info.State.Msgs != 6 {
			t.Fatalf("%s: %+v, %v; want 6 notifications", defs.notifications.Name, info, err)
		}
		m, err := notes.GetMsg(ctx, 1)
		if err != nil || m.Header.Get(jetstream.ExpectedStreamHeader) != defs.notifications.Name || !strings.HasPrefix(m.Header.Get(jetstream.MsgIDHeader), "notify:") {
			t.Fatalf("stored notification %+v, %v: want it pinned to %s with a notify: ID", m, err, defs.notifications.Name)
		}
		vpool, err := pgxpool.New(ctx, dsns["jetinbox_verifier"])
		if err != nil {
			t.Fatal(err)
		}
		defer vpool.Close()
		chain, err := verify.Chain(ctx, adminJS, verify.Postgres(vpool), verify.ChainOptions{ParentScope: durable, Stream: defs.notifications.Name})
		if err != nil {
			t.Fatal(err)
		}
		if !chain.Clean() || chain.Parents != 6 || chain.InStream != 6 || chain.Copies != 0 {
			t.Fatalf("chain check: %+v", chain)
		}
	})

	// The verifier (jetinbox verify -watch, and a full verify) under its own
	// NATS user and its own database role, jetinbox_verifier (SELECT only):
	// the settled pipeline is clean, and it is refused nothing.
	t.Run("verify", func(t *testing.T) {
		rec := startRecording(t, admin.nc)
		verifier := connectAs(t, one, fx, "verify")
		js, err := jetstream.New(verifier.nc)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, dsns["jetinbox_verifier"])
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		opts := verify.Options{Stream: stream, Scope: durable, Durable: durable, Ledger: true}
		w, err := verify.NewWatch(js, pool, opts, "")
		if err != nil {
			t.Fatal(err)
		}
		var judged *verify.Report
		for range 2 {
			r, err := w.Round(ctx)
			if err != nil {
				t.Fatalf("verify -watch round under the verify role: %v", err)
			}
			judged = cmp.Or(r, judged)
		}
		if judged == nil || !judged.Clean() || judged.StreamMessages != 7 {
			t.Fatalf("verify -watch: %+v, want the 7 messages clean", judged)
		}
		// A give-up whose rescue is pending (an advisory as the server
		// publishes it, for a message settled already; no consumer runs to
		// settle it): a full verify reads the advisories above the rescue
		// durable's ack floor, whose messages await rescue.
		planted := fmt.Sprintf(`{"type":"io.nats.jetstream.advisory.v1.max_deliver","id":"pending","timestamp":%q,"stream":%q,"consumer":%q,"stream_seq":1,"deliveries":5}`,
			time.Now().UTC().Format(time.RFC3339Nano), stream, durable)
		if err := admin.nc.Publish("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+stream+"."+durable, []byte(planted)); err != nil {
			t.Fatal(err)
		}
		eventually(t, ctx, func() error {
			rc, err := adminJS.Consumer(ctx, defs.advisories.Name, durable)
			if err != nil {
				return err
			}
			if info, err := rc.Info(ctx); err != nil || info.NumPending == 0 {
				return fmt.Errorf("rescue durable %+v (%v): the advisory is not pending", info, err)
			}
			return nil
		})
		r, err := verify.Run(ctx, js, pool, opts)
		if err != nil {
			t.Fatalf("verify under the verify role: %v", err)
		}
		if !r.Clean() || r.AppliedOnce != 6 || r.DeadLettered != 1 {
			var b strings.Builder
			r.WriteTable(&b)
			t.Fatalf("verify:\n%s", b.String())
		}
		verifier.expectNoAsyncError(t)
		verifier.nc.Close()
		// Direct gets read both streams; the verifier made no consumer.
		rec.check(t, "verify", verifyPublish)
		if info, err := intents.Info(ctx); err != nil || info.State.Consumers != 1 {
			t.Errorf("%s has %+v consumers (%v), want the ledger durable alone", stream, info.State.Consumers, err)
		}
	})

	t.Run("console", func(t *testing.T) {
		consoleUnderVerifier(t, ctx, one, fx, dsns["jetinbox_verifier"], stream, durable, admin.nc)
	})

	// An operator who upgrades without the advisory stream: the consumer
	// may not create it, and refuses to start instead of running without
	// rescues.
	t.Run("advisory stream missing", func(t *testing.T) {
		if err := adminJS.DeleteStream(ctx, defs.advisories.Name); err != nil {
			t.Fatal(err)
		}
		consumer := connectAs(t, one, fx, "consumer")
		c, _ := projectConsumer(t, ctx, consumer, consumerDSN, stream, durable)
		// No deadline, as in cmd/consumer: the client's own timeouts apply.
		runCtx, stop := context.WithCancel(context.Background())
		defer stop()
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		var err error
		select {
		case err = <-done:
		case <-ctx.Done():
			t.Fatalf("Run without %s did not stop", defs.advisories.Name)
		}
		if err == nil || !strings.Contains(err.Error(), defs.advisories.Name) || !strings.Contains(err.Error(), "deploy/jetstream/advisories-stream.json") {
			t.Fatalf("Run without %s: %v; want an error naming it and its definition", defs.advisories.Name, err)
		}
		t.Logf("Run: %v", err)
		consumer.waitViolation(t, `"$JS.API.STREAM.CREATE.`+defs.advisories.Name+`"`)
	})
}

// projectConsumer builds the consumer as cmd/consumer does: a pool as
// jetinbox_consumer with the schema checked, the ledger effect under its
// scope through the inbox, the jsinbox consumer on the client's
// connection. Its log is shown if the test fails.
func projectConsumer(t *testing.T, ctx context.Context, cl *client, dsn, stream, durable string) (*jsinbox.Consumer, *pgxpool.Pool) {
	t.Helper()
	js, err := jetstream.New(cl.nc)
	if err != nil {
		t.Fatal(err)
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pginbox.New(pool).CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	logs := &testenv.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("consumer log:\n%s", logs.String())
		}
	})
	effect, err := effects.NewScopedLedger(durable)
	if err != nil {
		t.Fatal(err)
	}
	// The shipped consumer runs with -follow-ups notifications.
	if effect, err = effect.WithFollowUps(effects.FollowUps{Subject: "notifications"}); err != nil {
		t.Fatal(err)
	}
	proc, err := inbox.NewProcessor(pginbox.New(pool), effect, inbox.Config{Scope: durable, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	c, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{Stream: stream, Durable: durable})
	if err != nil {
		t.Fatal(err)
	}
	return c, pool
}

// fetchOne pulls at most one message from cons, waiting up to wait.
func fetchOne(t *testing.T, cons jetstream.Consumer, wait time.Duration) jetstream.Msg {
	t.Helper()
	b, err := cons.Fetch(1, jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatal(err)
	}
	var got jetstream.Msg
	for m := range b.Messages() {
		got = m
	}
	if err := b.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		t.Fatal(err)
	}
	return got
}

// recording collects the subjects clients publish to in the account.
type recording struct {
	nc  *nats.Conn
	sub *nats.Subscription
}

func startRecording(t *testing.T, nc *nats.Conn) *recording {
	t.Helper()
	sub, err := nc.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &recording{nc: nc, sub: sub}
}

// check stops the recording, once the recorded client's connection is
// closed (flushed), and compares what it published with allow: all of it
// allowed (the server refuses the rest, so this checks the recording), and
// every allowed subject but $JS.API.INFO used.
func (r *recording) check(t *testing.T, role string, allow []string) {
	t.Helper()
	if err := r.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	used := map[string]int{}
	var stray []string
	for {
		m, err := r.sub.NextMsg(100 * time.Millisecond)
		if err != nil {
			break
		}
		// Replies, the server's advisories, and messages JetStream
		// delivers (to a pull request's inbox, under their own subject)
		// are not the client's.
		if strings.HasPrefix(m.Subject, "_INBOX") || strings.HasPrefix(m.Subject, "_R_.") || strings.HasPrefix(m.Subject, "$JS.EVENT.") || strings.HasPrefix(m.Reply, "$JS.ACK.") {
			continue
		}
		i := slices.IndexFunc(allow, func(p string) bool { return subjectMatches(p, m.Subject) })
		if i < 0 {
			stray = append(stray, m.Subject)
			continue
		}
		used[allow[i]]++
	}
	if err := r.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if len(stray) > 0 {
		t.Errorf("%s: published to %v, which its permissions do not allow (is the recording mixed up?)", role, stray)
	}
	for _, p := range allow {
		if used[p] == 0 && p != "$JS.API.INFO" {
			t.Errorf("%s: may publish to %s but never did: a permission it does not need, or a path this test does not run", role, p)
		}
	}
	t.Logf("%s published to: %v", role, used)
}

// subjectMatches reports whether subject matches the NATS subject pattern
// ("*" one token, ">" the rest).
func subjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || tok != "*" && tok != s[i] {
			return false
		}
	}
	return len(p) == len(s)
}

// provisionPostgres sets up a throwaway PostgreSQL as an operator does with
// deploy/postgres (roles.sql, passwords, jetinbox's migrations as
// jetinbox_migrator, grants.sql), with the accounts the ledger intents name.
// It returns the connection string of each login role of roles.sql (TCP,
// sslmode=verify-full against the dev CA), by role name.
func provisionPostgres(t *testing.T, fx *secretsFixture) map[string]string {
	t.Helper()
	pg := startPostgres(t, fx)
	pg.superuser(t, "postgres", "CREATE DATABASE jetinbox")
	pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
	dsns := map[string]string{}
	for _, role := range dbRoles {
		pw := strings.TrimPrefix(role, "jetinbox_") + "-pw"
		pg.superuser(t, "jetinbox", fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, pw))
		dsns[role] = fmt.Sprintf("postgres://%s:%s@localhost:%d/jetinbox?sslmode=verify-full&sslrootcert=%s", role, pw, pg.port, url.QueryEscape(pg.ca))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	migrator, err := pgxpool.New(ctx, dsns["jetinbox_migrator"])
	if err != nil {
		t.Fatal(err)
	}
	defer migrator.Close()
	// What `jetinbox migrate` does.
	if _, err := pginbox.New(migrator).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := effects.Migrate(ctx, migrator); err != nil {
		t.Fatal(err)
	}
	if _, err := pginbox.New(migrator).Outbox().Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pg.as("jetinbox_migrator", "migrator-pw").mustFile(t, "postgres/grants.sql")
	if _, err := migrator.Exec(ctx, `INSERT INTO accounts (id) VALUES (1), (2)`); err != nil {
		t.Fatal(err)
	}
	return dsns
}

// dbRoles are the login roles of postgres/roles.sql.
var dbRoles = []string{"jetinbox_migrator", "jetinbox_consumer", "jetinbox_relay", "jetinbox_verifier", "jetinbox_maintainer"}
