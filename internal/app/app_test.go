package app

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/chaos"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

func TestMain(m *testing.M) {
	// The demo's HTTP hop starts this binary again as intake processes.
	subproc.Dispatch(map[string]func([]string) int{subproc.RoleJetinbox: chaos.ConsumerRole})
	testenv.MainNoLeaks(m)
}

func mapEnv(m map[string]string) cli.Env { return func(k string) string { return m[k] } }

// TestDemo runs the README's first command, smaller: faults on, verified,
// lost=0 and duplicated=0 or it fails.
func TestDemo(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	err := Demo(context.Background(), []string{"-intents", "1500"}, mapEnv(nil), nil, &out, &errOut)
	if err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	for _, want := range []string{`applied once +1500 `, `duplicated +0 +ok`, `lost +0 +ok`, `unexpected +0 +ok`, `dead-lettered +8 `, `consumer crashes +1 `,
		`retry-same-key +100 +0 +100 +0 .* ok`, `concurrent-same-key +100 +0 +100 +0 .* ok`} {
		if !regexp.MustCompile(`(?m)^ *` + want).MatchString(out.String()) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestFlagAndEnvErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		run  func(stderr io.Writer) error
		want string
		code int
	}{
		{"unknown command", func(w io.Writer) error {
			return Jetinbox(context.Background(), []string{"frobnicate"}, mapEnv(nil), nil, io.Discard, w)
		}, "unknown command", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := c.run(&stderr)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
			if got := cli.ExitCode(err); got != c.code {
				t.Fatalf("exit code %d, want %d (err %v)", got, c.code, err)
			}
		})
	}
}

func TestHelpDocumentsFlags(t *testing.T) {
	t.Parallel()
	// Every command that touches the inbox takes the scope as a setting of
	// its own, says what it is, and keeps it apart from the durable.
	for name, cmd := range map[string]func(io.Writer) error{
		"consumer": func(w io.Writer) error {
			return cli.Consumer(context.Background(), []string{"-h"}, mapEnv(nil), io.Discard, w)
		},
		"verify": func(w io.Writer) error {
			return Verify(context.Background(), []string{"-h"}, mapEnv(nil), nil, io.Discard, w)
		},
		"replay": func(w io.Writer) error {
			return Replay(context.Background(), []string{"-h"}, mapEnv(nil), nil, io.Discard, w)
		},
		"prune": func(w io.Writer) error {
			return Prune(context.Background(), []string{"-h"}, mapEnv(nil), nil, io.Discard, w)
		},
		"demo": func(w io.Writer) error {
			return Demo(context.Background(), []string{"-h"}, mapEnv(nil), nil, io.Discard, w)
		},
	} {
		var help bytes.Buffer
		if err := cmd(&help); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s -h: %v", name, err)
		}
		for _, want := range []string{"-scope", "identity of the effect", "Never change it for a running pipeline", "JETINBOX_SCOPE", `(default "ledger")`} {
			if !strings.Contains(help.String(), want) {
				t.Errorf("%s -h lacks %q", name, want)
			}
		}
		if strings.Contains(help.String(), "also the inbox scope") {
			t.Errorf("%s -h still ties the scope to the durable", name)
		}
		// Listeners default to loopback; every NATS client takes its own
		// reply prefix.
		if name == "verify" && !strings.Contains(help.String(), `(default "127.0.0.1:9091")`) {
			t.Errorf("verify -h: -http does not default to loopback:\n%s", help.String())
		}
		if name != "demo" && !strings.Contains(help.String(), "NATS_INBOX_PREFIX") {
			t.Errorf("%s -h lacks NATS_INBOX_PREFIX", name)
		}
	}
}

// TestVerifyAndReplayCommands: on a settled pipeline verify exits 0 and
// replay finds only duplicates; a planted duplicate effect makes verify exit
// 1, and a deleted inbox row makes replay apply again and exit 1.
func TestVerifyAndReplayCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, dbURL, pool, js := commandPipeline(t, 300, "vr")
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	consumeSettled(t, env, js)

	var out bytes.Buffer
	if err := Verify(ctx, nil, env, nil, &out, io.Discard); err != nil {
		t.Fatalf("verify on a clean pipeline: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := Verify(ctx, []string{"-json"}, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), `"applied_once": 300`) {
		t.Fatalf("verify -json: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := Replay(ctx, nil, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "duplicates (no effect)   300") {
		t.Fatalf("replay: %v\n%s", err, out.String())
	}
	if err := Verify(ctx, nil, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatalf("verify after replay: %v", err)
	}

	// An inbox row that vanished (pruned too early): a replay (a dry run by
	// default) says the message would be applied and changes nothing; with
	// -apply it applies the message a second time, and both commands say so.
	if _, err := pool.Exec(ctx, `DELETE FROM inbox WHERE message_id = 'vr-7'`); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err := Replay(ctx, nil, env, nil, &out, io.Discard)
	if cli.ExitCode(err) != 1 || !strings.Contains(out.String(), "would apply              1") {
		t.Fatalf("replay over a missing inbox row: %v (exit %d)\n%s", err, cli.ExitCode(err), out.String())
	}
	if n := ledgerEntries(t, pool); n != 300 {
		t.Fatalf("a dry-run replay changed the ledger: %d entries, want 300", n)
	}
	out.Reset()
	err = Replay(ctx, []string{"-apply"}, env, nil, &out, io.Discard)
	if cli.ExitCode(err) != 1 || !strings.Contains(out.String(), "applied now              1") {
		t.Fatalf("replay -apply over a missing inbox row: %v (exit %d)\n%s", err, cli.ExitCode(err), out.String())
	}
	out.Reset()
	textfile := filepath.Join(t.TempDir(), "verify.prom")
	err = Verify(ctx, []string{"-textfile", textfile}, env, nil, &out, io.Discard)
	if cli.ExitCode(err) != 1 || !regexp.MustCompile(`(?m)^ *duplicated +1 +VIOLATION`).MatchString(out.String()) {
		t.Fatalf("verify after a double apply: %v (exit %d)\n%s", err, cli.ExitCode(err), out.String())
	}
	if b, _ := os.ReadFile(textfile); !regexp.MustCompile(`(?m)^jetinbox_verify_violations\{kind="duplicated"\} [1-9]`).Match(b) {
		t.Fatalf("textfile: %s", b)
	}
	// Unreachable servers are exit code 2.
	err = Verify(ctx, nil, mapEnv(map[string]string{"NATS_URL": "nats://127.0.0.1:1", "DATABASE_URL": dbURL}), nil, io.Discard, io.Discard)
	if cli.ExitCode(err) != 2 {
		t.Fatalf("verify without NATS: %v (exit %d), want 2", err, cli.ExitCode(err))
	}
}

// commandPipeline starts a nats-server and a migrated database and publishes
// n intents with the producer command.
func commandPipeline(t *testing.T, n int, prefix string) (*natsenv.NATS, string, *pgxpool.Pool, jetstream.JetStream) {
	t.Helper()
	ctx := context.Background()
	e := pipelinetest.Start(t)
	srv, dbURL, pool, js := e.NATS, e.DBURL, e.Pool, e.JS
	if err := pipeline.Setup(ctx, js, pool, jsinbox.StreamConfig{}, 1024); err != nil {
		t.Fatal(err)
	}
	env := mapEnv(map[string]string{"NATS_URL": srv.URL()})
	if err := cli.Producer(ctx, []string{"-count", strconv.Itoa(n), "-prefix", prefix}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	return srv, dbURL, pool, js
}

// TestPruneReadsTheHorizon: prune refuses a horizon shorter than the
// stream's MaxAge (read from the server) and deletes old rows otherwise.
func TestPruneReadsTheHorizon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, dbURL, pool, _ := commandPipeline(t, 0, "p")
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	if _, err := pool.Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint, received_at)
SELECT 'ledger', 'old-' || g, '\x00'::bytea, now() - interval '30 days' FROM generate_series(1, 25) g`); err != nil {
		t.Fatal(err)
	}
	err := Prune(ctx, []string{"-older-than", "24h"}, env, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "MaxAge") {
		t.Fatalf("prune inside the stream's 7-day MaxAge: %v", err)
	}
	// Sent outbox rows go with -outbox, under the same horizon; pending
	// ones stay however old.
	if _, err := pgoutbox.New(pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, subject, payload, fingerprint, created_at, sent_at)
SELECT 'o-' || g, 'notifications.1', '', '\x00'::bytea, now() - interval '30 days', CASE WHEN g <= 7 THEN now() END FROM generate_series(1, 10) g`); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	// Re-drives of the dead letters (kept 30 days) would stretch the
	// horizon past 30 days; this pipeline never re-drives.
	if err := Prune(ctx, []string{"-older-than", "720h", "-batch", "10", "-dlq-redrive=false", "-outbox"}, env, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "pruned 25 inbox rows") || !strings.Contains(out.String(), "pruned 7 sent outbox rows") {
		t.Fatalf("prune: %s", out.String())
	}
}

// withEnv returns base with more variables set.
func withEnv(base map[string]string, kv ...string) cli.Env {
	m := make(map[string]string, len(base)+len(kv)/2)
	for k, v := range base {
		m[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return mapEnv(m)
}

// consumeAll runs the consumer command with env until durable has settled
// the whole stream, then stops it.
func consumeAll(t *testing.T, js jetstream.JetStream, env cli.Env, durable string) {
	t.Helper()
	ctx := context.Background()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() { done <- cli.Consumer(cctx, []string{"-http", ""}, env, io.Discard, &logs) }()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	werr := pipeline.WaitSettled(wctx, js, jsinbox.DefaultStream, durable, nil)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consumer on %s: %v\n%s", durable, err, logs.String())
	}
	if werr != nil {
		t.Fatal(werr)
	}
}

// TestRenamedDurableKeepsTheScope: the inbox scope, not the durable's name,
// says which effect a message ID was applied to. Renaming the durable (or
// re-creating it, or mistyping it) redelivers the whole stream, and the
// inbox must find every message a duplicate.
func TestRenamedDurableKeepsTheScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, dbURL, pool, js := commandPipeline(t, 200, "sc")
	base := map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL}
	consumeAll(t, js, withEnv(base, "JETINBOX_DURABLE", "ledger-a"), "ledger-a")
	if n := ledgerEntries(t, pool); n != 200 {
		t.Fatalf("after durable ledger-a: %d ledger entries, want 200", n)
	}
	consumeAll(t, js, withEnv(base, "JETINBOX_DURABLE", "ledger-b"), "ledger-b")
	if n := ledgerEntries(t, pool); n != 200 {
		t.Fatalf("a renamed durable with the same scope applied the stream again: %d ledger entries, want 200", n)
	}
	var out bytes.Buffer
	if err := Verify(ctx, nil, withEnv(base, "JETINBOX_DURABLE", "ledger-b"), nil, &out, io.Discard); err != nil {
		t.Fatalf("verify after the rename: %v\n%s", err, out.String())
	}
}

// TestVerifyPerScope: a second scope over the same stream is a second effect
// with ledger entries of its own; verify of one scope judges only its own
// rows and entries, and balances hold with both applied.
func TestVerifyPerScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, dbURL, pool, js := commandPipeline(t, 200, "ps")
	base := map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL}
	consumeAll(t, js, mapEnv(base), "ledger")
	consumeAll(t, js, withEnv(base, "JETINBOX_SCOPE", "audit", "JETINBOX_DURABLE", "audit"), "audit")
	if n := ledgerEntries(t, pool); n != 400 {
		t.Fatalf("two scopes: %d ledger entries in all, want 200 per scope", n)
	}
	for _, env := range []cli.Env{mapEnv(base), withEnv(base, "JETINBOX_SCOPE", "audit", "JETINBOX_DURABLE", "audit")} {
		var out bytes.Buffer
		err := Verify(ctx, nil, env, nil, &out, io.Discard)
		if err != nil || !regexp.MustCompile(`(?m)^ *applied once +200 `).MatchString(out.String()) {
			t.Fatalf("verify of scope %q with both scopes' entries in the ledger: %v\n%s", env("JETINBOX_SCOPE"), err, out.String())
		}
	}
}

func ledgerEntries(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger_entries`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestVerifyRangeAndScopeMistakes: a reversed range is a usage error (exit
// 2), not a clean report of nothing; a scope without a single inbox row says
// first that -scope is likely wrong and names the scopes that have rows.
func TestVerifyRangeAndScopeMistakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, dbURL, _, js := commandPipeline(t, 50, "vm")
	base := map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL}
	consumeAll(t, js, mapEnv(base), "ledger")

	var out bytes.Buffer
	err := Verify(ctx, []string{"-from-seq", "40", "-to-seq", "10"}, mapEnv(base), nil, &out, io.Discard)
	if cli.ExitCode(err) != 2 {
		t.Fatalf("verify -from-seq 40 -to-seq 10: %v (exit %d), want a usage error\n%s", err, cli.ExitCode(err), out.String())
	}

	out.Reset()
	err = Verify(ctx, nil, withEnv(base, "JETINBOX_SCOPE", "ledgr"), nil, &out, io.Discard)
	first, _, _ := strings.Cut(out.String(), "\n")
	if cli.ExitCode(err) != 1 || !strings.Contains(first, `scope "ledgr" has no inbox rows`) || !strings.Contains(first, `scopes with rows: "ledger"`) {
		t.Fatalf("verify of a scope without rows: %v (exit %d), want exit 1 and the likely cause first:\n%s", err, cli.ExitCode(err), out.String())
	}
	if strings.Contains(out.String(), "lost: stream seq") {
		t.Fatalf("verify of a scope without rows lists lost messages:\n%s", out.String())
	}
}

// TestPruneHorizonBoundaries: prune reads every part of the horizon from the
// servers (stream MaxAge and duplicate window, the durable's AckWait and
// MaxDeliver, the dead-letter stream's MaxAge), adds the nak cap and a
// margin, and refuses an -older-than that is not strictly longer, with exit
// code 2 and nothing deleted. The cut-off is PostgreSQL's clock.
func TestPruneHorizonBoundaries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pipelinetest.Start(t)
	srv, dbURL, pool, js := e.NATS, e.DBURL, e.Pool, e.JS
	// MaxAge 1h; 200 deliveries × (AckWait 30s + nak cap 30s) = 3h20m of
	// redeliveries outlast it; dead letters are kept 30 days.
	if err := pipeline.Setup(ctx, js, pool, jsinbox.StreamConfig{MaxAge: time.Hour, DuplicateWindow: 2 * time.Minute}, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 30 * time.Second, MaxDeliver: 200, MaxAckPending: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint, received_at)
SELECT 'ledger', 'r-' || n, '\x00'::bytea, now() - (n || ' seconds')::interval
FROM unnest(ARRAY[31*86400, 30*86400, 4*3600 + 22*60 + 3, 4*3600 + 21*60]) AS n`); err != nil {
		t.Fatal(err)
	}
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	rows := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	refused := func(want string, args ...string) {
		t.Helper()
		var out bytes.Buffer
		err := Prune(ctx, args, env, nil, &out, io.Discard)
		if cli.ExitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), want) {
			t.Fatalf("prune %v: %v (exit %d), want exit 2 mentioning %q\n%s", args, err, cli.ExitCode(err), want, out.String())
		}
		if n := rows(); n != 4 {
			t.Fatalf("prune %v was refused but left %d of 4 rows", args, n)
		}
	}
	// Re-drives count by default: late copies 2m + stream life 3h20m +
	// dead letters 30d + stream life 3h20m. 30 days is not enough.
	refused("re-drives", "-older-than", "720h")
	// Without re-drives: 2m + 3h20m = 3h22m, plus the 1h margin.
	noRedrive := []string{"-dlq-redrive=false", "-publish-retry", "1m"}
	refused("not longer than the horizon 3h22m0s + margin 1h0m0s", append(noRedrive, "-older-than", "3h22m")...)
	refused("not longer than the horizon 3h22m0s + margin 1h0m0s", append(noRedrive, "-older-than", "4h22m")...)
	// A longer nak cap lengthens every redelivery.
	refused("nak cap 1m0s", append(noRedrive, "-older-than", "4h22m1s", "-nak-cap", "1m")...)
	var out bytes.Buffer
	if err := Prune(ctx, append(noRedrive, "-older-than", "4h22m1s"), env, nil, &out, io.Discard); err != nil {
		t.Fatalf("prune past the boundary: %v", err)
	}
	if !strings.Contains(out.String(), "pruned 3 inbox rows") || rows() != 1 {
		t.Fatalf("prune -older-than 4h22m1s: %s(%d rows left, want only the one received 4h21m ago)", out.String(), rows())
	}
}

// TestReplayChangesNothingByDefault: replay is a dry run unless -apply: a
// message whose inbox row is gone is reported as "would apply" (exit 1) and
// the ledger and the inbox stay as they were. In neither mode does replay
// dead-letter a message again: rejected ones are counted. -to-seq bounds the
// range, and a reversed range is a usage error.
func TestReplayChangesNothingByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pipelinetest.Start(t)
	srv, dbURL, pool, js := e.NATS, e.DBURL, e.Pool, e.JS
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	// A short duplicate window, also the dead-letter stream's: a second
	// dead letter for the same message would not be dropped as a copy.
	const window = time.Second
	if err := pipeline.Setup(ctx, js, pool, jsinbox.StreamConfig{DuplicateWindow: window}, 16); err != nil {
		t.Fatal(err)
	}
	pub, _ := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	defer pub.Close()
	intents := pipeline.Generate(pipeline.Load{Count: 100, Accounts: 16, Prefix: "rd"})
	intents = append(intents, inbox.Intent{ID: "rd-bad-1", Subject: "intents.x", Payload: []byte(`{"account":1,`)},
		inbox.Intent{ID: "rd-bad-2", Subject: "intents.x", Payload: []byte(`{"account":99999,"amount":5}`)})
	for _, in := range intents {
		if err := pub.PublishAsync(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	consumeAll(t, js, env, "ledger")
	deadLetters := func() uint64 {
		t.Helper()
		s, err := js.Stream(ctx, jsinbox.DefaultStream+"_DLQ")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	inboxRows := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if d, e := deadLetters(), ledgerEntries(t, pool); d != 2 || e != 100 {
		t.Fatalf("after consuming: %d dead letters, %d ledger entries; want 2 and 100", d, e)
	}
	time.Sleep(window + 200*time.Millisecond)

	// "Pruned too early": one applied message's row is gone.
	if _, err := pool.Exec(ctx, `DELETE FROM inbox WHERE message_id = 'rd-7'`); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := Replay(ctx, nil, env, nil, &out, io.Discard)
	for _, want := range []string{"dry run", "duplicates (no effect)   99", "rejected before          2", "would apply              1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry-run replay output lacks %q", want)
		}
	}
	if cli.ExitCode(err) != 1 || t.Failed() {
		t.Fatalf("dry-run replay over a missing row: %v (exit %d), want exit 1\n%s", err, cli.ExitCode(err), out.String())
	}
	if d, e, r := deadLetters(), ledgerEntries(t, pool), inboxRows(); d != 2 || e != 100 || r != 101 {
		t.Fatalf("a dry-run replay changed things: %d dead letters (want 2), %d ledger entries (want 100), %d inbox rows (want 101)", d, e, r)
	}

	out.Reset()
	if err := Replay(ctx, []string{"-from-seq", "1", "-to-seq", "5"}, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "replayed 5 messages") {
		t.Fatalf("replay -to-seq 5: %v\n%s", err, out.String())
	}
	out.Reset()
	err = Replay(ctx, []string{"-from-seq", "50", "-to-seq", "10"}, env, nil, &out, io.Discard)
	if cli.ExitCode(err) != 2 {
		t.Fatalf("replay -from-seq 50 -to-seq 10: %v (exit %d), want a usage error\n%s", err, cli.ExitCode(err), out.String())
	}

	out.Reset()
	err = Replay(ctx, []string{"-apply"}, env, nil, &out, io.Discard)
	if cli.ExitCode(err) != 1 || !strings.Contains(out.String(), "applied now              1") || !strings.Contains(out.String(), "rejected before          2") {
		t.Fatalf("replay -apply over a missing row: %v (exit %d)\n%s", err, cli.ExitCode(err), out.String())
	}
	if d, r := deadLetters(), inboxRows(); d != 2 || r != 102 {
		t.Fatalf("after replay -apply: %d dead letters (want 2, none published again), %d inbox rows (want 102)", d, r)
	}
}

// TestEveryDocumentedCommandExists: every `jetinbox <command>` the README,
// deploy/README.md or a page of docs/ names, and every command `jetinbox -h`
// lists, runs `-h` with exit 0 through the dispatcher, as an operator would
// call it.
func TestEveryDocumentedCommandExists(t *testing.T) {
	t.Parallel()
	named := map[string]bool{}
	// In code: a command line in a fenced block, or inline code.
	inBlock := regexp.MustCompile(`^\s*(?:\$ )?(?:go run )?(?:\S*/)?jetinbox ([a-z][a-z-]+)`)
	inline := regexp.MustCompile("`(?:[^`]*/)?jetinbox ([a-z][a-z-]+)")
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("no pages in ../../docs: %v", err)
	}
	for _, doc := range append([]string{"../../README.md", "../../deploy/README.md"}, pages...) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		fenced := false
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				continue
			}
			re := inline
			if fenced {
				re = inBlock
			}
			for _, m := range re.FindAllStringSubmatch(line, -1) {
				named[m[1]] = true
			}
		}
	}
	var usage bytes.Buffer
	_ = Jetinbox(context.Background(), []string{"-h"}, mapEnv(nil), nil, io.Discard, &usage)
	for _, line := range strings.Split(usage.String(), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(line, "  ") {
			named[f[0]] = true
		}
	}
	for _, word := range []string{"demo", "verify", "replay", "prune", "migrate", "chaos", "bench", "jitter", "consumer", "relay"} {
		if !named[word] {
			t.Errorf("jetinbox %s is neither in the READMEs, docs/ nor -h", word)
		}
	}
	for name := range named {
		var out bytes.Buffer
		err := Jetinbox(context.Background(), []string{name, "-h"}, mapEnv(nil), nil, io.Discard, &out)
		if code := cli.ExitCode(err); code != 0 {
			t.Errorf("jetinbox %s -h: exit %d (%v)\n%s", name, code, err, out.String())
		}
	}
}

// consumeSettled runs the consumer command (as the binary would, with env)
// until the durable has settled the whole stream, then stops it; the
// consumer must return nil.
func consumeSettled(t *testing.T, env cli.Env, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cli.Consumer(ctx, []string{"-http", ""}, env, io.Discard, io.Discard) }()
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	err := pipeline.WaitSettled(wctx, js, jsinbox.DefaultStream, "ledger", nil)
	cancel()
	if cerr := <-done; cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
}
