package verify_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/effects"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/verify"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// settledPipeline publishes n intents and consumes them all.
func settledPipeline(t *testing.T, n int) (jetstream.JetStream, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	srv := testenv.NewNATS(t, testenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pipeline.Setup(ctx, js, pool, jsinbox.StreamOptions{}, 16); err != nil {
		t.Fatal(err)
	}
	pub, _ := jsinbox.NewPublisher(ctx, js, jsinbox.PublisherConfig{})
	for _, in := range pipeline.Generate(pipeline.Load{Count: n, Accounts: 16, Prefix: "v"}) {
		if err := pub.Publish(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	proc, _ := inbox.NewProcessor(pool, inbox.Config{Scope: "ledger", Handler: effects.NewLedger()})
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
