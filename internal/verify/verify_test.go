package verify_test

import (
	"context"
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
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/verify"
)

func TestMain(m *testing.M) { testenv.MainNoLeaks(m) }

// settledPipeline publishes n intents and consumes them all.
func settledPipeline(t *testing.T, n int) (jetstream.JetStream, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	e := pipelinetest.New(t, jsinbox.StreamConfig{}, 16)
	js, pool := e.JS, e.Pool
	pub, _ := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	defer pub.Close()
	for _, in := range pipeline.Generate(pipeline.Load{Count: n, Accounts: 16, Prefix: "v"}) {
		if err := pub.PublishAsync(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	proc, _ := inbox.NewProcessor(pginbox.New(pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	c, _ := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := pipeline.WaitSettled(wctx, js, jsinbox.DefaultStream, "ledger", nil); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return js, pool
}

func run(t *testing.T, js jetstream.JetStream, pool *pgxpool.Pool) *verify.Report {
	t.Helper()
	r, err := verify.Run(context.Background(), js, pool, verify.Options{Scope: "ledger", Durable: "ledger", Ledger: true})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestVerifyCatchesViolations plants each kind of violation in a clean
// pipeline's database and checks verify reports it.
func TestVerifyCatchesViolations(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		plant string
		check func(r *verify.Report) bool
	}{
		{"duplicate ledger entry", `INSERT INTO ledger_entries (message_id, account, amount) SELECT message_id, account, amount FROM ledger_entries WHERE message_id = 'v-3'`,
			func(r *verify.Report) bool { return r.Duplicated == 1 && r.BalanceMismatches == 0 || r.Duplicated == 1 }},
		{"inbox row deleted", `DELETE FROM inbox WHERE message_id = 'v-4'`,
			func(r *verify.Report) bool { return r.Lost == 1 && r.EffectWithoutRow == 1 }},
		{"effect removed", `DELETE FROM ledger_entries WHERE message_id = 'v-5'`,
			func(r *verify.Report) bool { return r.RowWithoutEffect == 1 }},
		{"unexpected effect", `INSERT INTO ledger_entries (message_id, account, amount) VALUES ('ghost', 1, 5)`,
			func(r *verify.Report) bool { return r.Unexpected == 1 && r.EffectWithoutRow == 1 }},
		// The subject is part of an intent's identity: a row for the
		// same ID and payload on another subject settles nothing here.
		{"row made on another subject", `UPDATE inbox SET subject = 'intents.elsewhere' WHERE message_id = 'v-6'`,
			func(r *verify.Report) bool { return r.Lost == 1 }},
		{"balance changed behind the ledger's back", `UPDATE accounts SET balance = balance + 1 WHERE id = 2`,
			func(r *verify.Report) bool { return r.BalanceMismatches == 1 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			js, pool := settledPipeline(t, 50)
			if r := run(t, js, pool); !r.Clean() || r.AppliedOnce != 50 {
				t.Fatalf("clean pipeline reported %+v", r)
			}
			if _, err := pool.Exec(context.Background(), c.plant); err != nil {
				t.Fatal(err)
			}
			r := run(t, js, pool)
			if r.Clean() || !c.check(r) {
				var b strings.Builder
				r.WriteTable(&b)
				t.Fatalf("verify missed the planted violation:\n%s", b.String())
			}
		})
	}
}

func TestVerifyRange(t *testing.T) {
	t.Parallel()
	js, pool := settledPipeline(t, 60)
	if _, err := pool.Exec(context.Background(), `DELETE FROM inbox WHERE message_id = 'v-5'`); err != nil {
		t.Fatal(err)
	}
	// v-5 is stream sequence 6: a range after it is clean...
	r, err := verify.Run(context.Background(), js, pool, verify.Options{Scope: "ledger", Ledger: true, Range: verify.Range{FromSeq: 10, ToSeq: 30}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Clean() || r.StreamMessages != 21 || !r.Partial || r.AppliedOnce != 21 {
		t.Fatalf("range 10-30: %+v", r)
	}
	// ...and a range over it is not.
	r, err = verify.Run(context.Background(), js, pool, verify.Options{Scope: "ledger", Ledger: true, Range: verify.Range{ToSeq: 8}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Clean() || r.Lost != 1 || r.StreamMessages != 8 {
		t.Fatalf("range 1-8 over a deleted row: %+v", r)
	}
}

// consumeSettled runs a jetinbox consumer on durable "ledger" until it has
// settled the stream, then stops it.
func consumeSettled(t *testing.T, js jetstream.JetStream, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	proc, _ := inbox.NewProcessor(pginbox.New(pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	c, _ := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{Durable: "ledger"})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	werr := pipeline.WaitSettled(wctx, js, jsinbox.DefaultStream, "ledger", nil)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if werr != nil {
		t.Fatal(werr)
	}
}

// TestVerifyTrustsDeadLettersByHeader: a dead letter settles the stream
// message it names by stream, scope, sequence AND message ID; one whose ID
// is not that of the message at its sequence settles nothing. A copy of a
// rejected ID published again later (which the consumer terminates without
// a second dead letter) is settled by the dead letter at the sequence the
// rejected inbox row records.
func TestVerifyTrustsDeadLettersByHeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const window = time.Second
	e := pipelinetest.New(t, jsinbox.StreamConfig{DuplicateWindow: window}, 16)
	js, pool := e.JS, e.Pool
	pub, _ := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	defer pub.Close()
	publish := func(ins ...inbox.Intent) {
		t.Helper()
		for _, in := range ins {
			if err := pub.PublishAsync(ctx, in); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	poison := inbox.Intent{ID: "bad-1", Subject: "intents.poison", Payload: []byte(`{"account":1,`)}
	publish(append(pipeline.Generate(pipeline.Load{Count: 20, Accounts: 16, Prefix: "d"}), poison)...) // poison is seq 21
	consumeSettled(t, js, pool)
	check := func(what string, ok func(r *verify.Report) bool) {
		t.Helper()
		r, err := verify.Run(ctx, js, pool, verify.Options{Scope: "ledger", Ledger: true})
		if err != nil {
			t.Fatal(err)
		}
		if !ok(r) {
			var b strings.Builder
			r.WriteTable(&b)
			t.Fatalf("%s:\n%s", what, b.String())
		}
	}
	check("settled pipeline with one poison message", func(r *verify.Report) bool {
		return r.Clean() && r.DeadLettered == 1 && r.Rejected == 1 && r.AppliedOnce == 20
	})

	// The rejected ID published again after the duplicate window: seq 22.
	// The consumer terminates such a copy without dead-lettering it again.
	time.Sleep(window + 200*time.Millisecond)
	publish(poison)
	check("a rejected ID published again, dead-lettered once at the row's sequence", func(r *verify.Report) bool {
		return r.Clean() && r.StreamMessages == 22 && r.DeadLettered == 1
	})

	// seq 23 was never consumed; a dead letter naming seq 23 with another
	// message's ID must not settle it.
	publish(inbox.Intent{ID: "orphan", Subject: "intents.1", Payload: effects.Intent{Account: 1, Amount: 5}.AppendJSON(nil)})
	forged := nats.NewMsg(jsinbox.DeadLetterPrefix + "intents.1")
	forged.Data = []byte(`{"account":1,"amount":5}`)
	for k, v := range map[string]string{jsinbox.HeaderStream: jsinbox.DefaultStream, jsinbox.HeaderScope: "ledger",
		jsinbox.HeaderStreamSeq: "23", jsinbox.HeaderMessageID: "someone-else", jsinbox.HeaderStatus: "rejected"} {
		forged.Header.Set(k, v)
	}
	// Published as a consumer publishes its dead letters, so that only
	// the message ID is wrong.
	if _, err := js.PublishMsg(ctx, forged, jetstream.WithMsgID("ledger:"+jsinbox.DefaultStream+":23"),
		jetstream.WithExpectStream(jsinbox.DeadLetterStream(jsinbox.DefaultStream))); err != nil {
		t.Fatal(err)
	}
	check("a dead letter whose ID is not the message's", func(r *verify.Report) bool {
		return !r.Clean() && r.Lost == 1 && r.DeadMismatched == 1 && r.DeadLettered == 1 &&
			strings.Contains(strings.Join(r.Examples, "\n"), `lost: stream seq 23 (id "orphan")`)
	})
}
