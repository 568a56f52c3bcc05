package app

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func mapEnv(m map[string]string) Env { return func(k string) string { return m[k] } }

// TestDemo runs the README's first command, smaller: faults on, verified,
// lost=0 and duplicated=0 or it fails.
func TestDemo(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	err := Demo(context.Background(), []string{"-intents", "1500"}, mapEnv(nil), nil, &out, &errOut)
	if err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	for _, want := range []string{`applied once +1500 `, `duplicated +0 +ok`, `lost +0 +ok`, `unexpected +0 +ok`, `dead-lettered +8 `, `consumer crashes +1 `} {
		if !regexp.MustCompile(`(?m)^ *` + want).MatchString(out.String()) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestProducerJSONL(t *testing.T) {
	t.Parallel()
	srv := testenv.NewNATS(t, testenv.NATSOptions{})
	input := strings.Join([]string{
		`{"id":"a-1","payload":{"account":1,"amount":5}}`,
		`{"payload":{"account":1,"amount":5}}`,
		`{"id":"a-2","payload":{"account":2,  "amount":7},"subject":"intents.x"}`,
		`not json`,
		`{"id":"has space","payload":{}}`,
		``,
		`{"id":"a-3","payload":{"account":3,"amount":9},"extra":1}`,
		`{"id":"a-4"}`,
		`{"id":"a-5","payload":{"account":3,"amount":9},"subject":"$JS.API.STREAM.DELETE.INTENTS"}`,
		`{"id":"a-6","payload":[1,2]}`,
	}, "\n")
	var out, errOut bytes.Buffer
	err := Producer(context.Background(), []string{"-input", "-"}, mapEnv(map[string]string{"NATS_URL": srv.URL()}),
		strings.NewReader(input), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "6 input lines rejected") {
		t.Fatalf("err = %v, want 6 rejected lines\nstderr:\n%s", err, errOut.String())
	}
	for _, want := range []string{"line 2: id:", "line 4: not a JSON object", "line 5: id:", "line 7:", "line 8: payload is missing", "line 9: subject"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut.String())
		}
	}
	if !strings.Contains(out.String(), "published 3 ") {
		t.Fatalf("summary: %s", out.String())
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(context.Background(), jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != `{"account":2,"amount":7}` || m.Header.Get(jetstream.MsgIDHeader) != "a-2" || m.Subject != "intents.x" {
		t.Fatalf("second message: %s %q %v", m.Subject, m.Data, m.Header)
	}
}

// TestProducerBatches: generated load published in atomic batches, all of
// it stored, once.
func TestProducerBatches(t *testing.T) {
	t.Parallel()
	srv := testenv.NewNATS(t, testenv.NATSOptions{SyncAlways: true})
	var out, errOut bytes.Buffer
	if err := Producer(context.Background(), []string{"-count", "3000", "-batch", "500", "-prefix", "pb"}, mapEnv(map[string]string{"NATS_URL": srv.URL()}),
		nil, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "published 3000 ") || !strings.Contains(out.String(), "refused and published one by one 0)") {
		t.Fatalf("summary: %s", out.String())
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(context.Background(), jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 3000 {
		t.Fatalf("stream holds %d messages, want 3000", n)
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
		{"consumer without database", func(w io.Writer) error {
			return Consumer(context.Background(), nil, mapEnv(nil), io.Discard, w)
		}, "no database", 2},
		{"consumer bad drain timeout", func(w io.Writer) error {
			return Consumer(context.Background(), nil, mapEnv(map[string]string{"JETINBOX_DRAIN_TIMEOUT": "soon", "DATABASE_URL": "postgres://x"}), io.Discard, w)
		}, `JETINBOX_DRAIN_TIMEOUT="soon"`, 2},
		{"consumer cert without key", func(w io.Writer) error {
			return Consumer(context.Background(), nil, mapEnv(map[string]string{"NATS_CERT": "/c", "DATABASE_URL": "postgres://x"}), io.Discard, w)
		}, "both -nats-cert and -nats-key", 2},
		{"consumer missing creds file", func(w io.Writer) error {
			return Consumer(context.Background(), nil, mapEnv(map[string]string{"NATS_CREDS": "/nonexistent.creds", "DATABASE_URL": "postgres://x"}), io.Discard, w)
		}, "NATS_CREDS", 2},
		{"consumer unlimited deliveries", func(w io.Writer) error {
			return Consumer(context.Background(), []string{"-max-deliver", "-1"}, mapEnv(map[string]string{"DATABASE_URL": "postgres://x"}), io.Discard, w)
		}, "max-deliver", 2},
		{"producer bad dup fraction", func(w io.Writer) error {
			return Producer(context.Background(), []string{"-dup-fraction", "2"}, mapEnv(nil), nil, io.Discard, w)
		}, "dup-fraction", 2},
		{"producer batch too large", func(w io.Writer) error {
			return Producer(context.Background(), []string{"-batch", "5000"}, mapEnv(nil), nil, io.Discard, w)
		}, "-batch must be within", 2},
		{"unknown command", func(w io.Writer) error {
			return Jetinbox(context.Background(), []string{"frobnicate"}, mapEnv(nil), nil, io.Discard, w)
		}, "unknown command", 2},
		{"consumer nothing listening", func(w io.Writer) error {
			pg := testenv.NewDatabase(t)
			if err := Migrate(context.Background(), nil, mapEnv(map[string]string{"DATABASE_URL": pg}), nil, io.Discard, w); err != nil {
				return err
			}
			return Consumer(context.Background(), []string{"-http", ""}, mapEnv(map[string]string{"DATABASE_URL": pg, "NATS_URL": "nats://127.0.0.1:1"}), io.Discard, w)
		}, "connect to NATS", 1},
		{"consumer schema missing", func(w io.Writer) error {
			pg := testenv.NewDatabase(t)
			return Consumer(context.Background(), []string{"-http", ""}, mapEnv(map[string]string{"DATABASE_URL": pg}), io.Discard, w)
		}, "not migrated", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := c.run(&stderr)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
			if got := ExitCode(err); got != c.code {
				t.Fatalf("exit code %d, want %d (err %v)", got, c.code, err)
			}
		})
	}
}

func TestHelpDocumentsFlags(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	err := Consumer(context.Background(), []string{"-h"}, mapEnv(nil), io.Discard, &stderr)
	if !errors.Is(err, flag.ErrHelp) || ExitCode(err) != 0 {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"-database-url", "-batch", "(default 6000)", "-ack-wait", "(default 30s)", "NATS_CREDS", "-drain-timeout"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("consumer -h lacks %q", want)
		}
	}
	// Every command that touches the inbox takes the scope as a setting of
	// its own, says what it is, and keeps it apart from the durable.
	for name, cmd := range map[string]func(io.Writer) error{
		"consumer": func(w io.Writer) error {
			return Consumer(context.Background(), []string{"-h"}, mapEnv(nil), io.Discard, w)
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
	}
}

// TestConsumerCommandServesAndDrains runs the consumer command against real
// servers: it applies intents, reports ready, and on cancel drains and exits 0.
func TestConsumerCommandServesAndDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, dbURL, pool, js := commandPipeline(t, 500, "cmd")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- Consumer(cctx, []string{"-http", addr, "-log-format", "json"},
			mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL}), io.Discard, &logs)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never became ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := pipeline.WaitSettled(wctx, js, jsinbox.DefaultStream, "ledger", nil); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
	}
	for _, want := range []string{"jetinbox_applied_total 500", "jetinbox_batch_duration_seconds_count", "jetinbox_publish_to_commit_seconds_bucket",
		`jetinbox_duplicates_total{layer="inbox"} 0`, "jetinbox_consumer_pending_messages 0", "jetinbox_consumer_ack_pending_messages 0", "jetinbox_build_info{", "go_goroutines"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consumer after SIGTERM: %v\n%s", err, logs.String())
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries`).Scan(&n); err != nil || n != 500 {
		t.Fatalf("ledger has %d entries (%v), want 500", n, err)
	}
	if !strings.Contains(logs.String(), `"msg":"consumer: stopped"`) {
		t.Fatalf("no JSON stop line in logs:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "password") {
		t.Fatal("logs mention a password")
	}
	_ = fmt.Sprint
}

// TestVerifyAndReplayCommands: on a settled pipeline verify exits 0 and
// replay finds only duplicates; a planted duplicate effect makes verify exit
// 1, and a deleted inbox row makes replay apply again and exit 1.
func TestVerifyAndReplayCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, dbURL, pool, js := commandPipeline(t, 300, "vr")
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Consumer(cctx, []string{"-http", ""}, env, io.Discard, io.Discard) }()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := pipeline.WaitSettled(wctx, js, jsinbox.DefaultStream, "ledger", nil); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

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
	if ExitCode(err) != 1 || !strings.Contains(out.String(), "would apply              1") {
		t.Fatalf("replay over a missing inbox row: %v (exit %d)\n%s", err, ExitCode(err), out.String())
	}
	if n := ledgerEntries(t, pool); n != 300 {
		t.Fatalf("a dry-run replay changed the ledger: %d entries, want 300", n)
	}
	out.Reset()
	err = Replay(ctx, []string{"-apply"}, env, nil, &out, io.Discard)
	if ExitCode(err) != 1 || !strings.Contains(out.String(), "applied now              1") {
		t.Fatalf("replay -apply over a missing inbox row: %v (exit %d)\n%s", err, ExitCode(err), out.String())
	}
	out.Reset()
	textfile := filepath.Join(t.TempDir(), "verify.prom")
	err = Verify(ctx, []string{"-textfile", textfile}, env, nil, &out, io.Discard)
	if ExitCode(err) != 1 || !regexp.MustCompile(`(?m)^ *duplicated +1 +VIOLATION`).MatchString(out.String()) {
		t.Fatalf("verify after a double apply: %v (exit %d)\n%s", err, ExitCode(err), out.String())
	}
	if b, _ := os.ReadFile(textfile); !regexp.MustCompile(`(?m)^jetinbox_verify_violations [1-9]`).Match(b) {
		t.Fatalf("textfile: %s", b)
	}
	// Unreachable servers are exit code 2.
	err = Verify(ctx, nil, mapEnv(map[string]string{"NATS_URL": "nats://127.0.0.1:1", "DATABASE_URL": dbURL}), nil, io.Discard, io.Discard)
	if ExitCode(err) != 2 {
		t.Fatalf("verify without NATS: %v (exit %d), want 2", err, ExitCode(err))
	}
}

// TestTracingOffUnlessConfigured: no spans by default; JETINBOX_TRACE=stdout
// prints them.
func TestTracingOffUnlessConfigured(t *testing.T) {
	t.Parallel()
	srv := testenv.NewNATS(t, testenv.NATSOptions{})
	for _, traceOn := range []bool{false, true} {
		env := map[string]string{"NATS_URL": srv.URL()}
		if traceOn {
			env["JETINBOX_TRACE"] = "stdout"
		}
		var stderr bytes.Buffer
		if err := Producer(context.Background(), []string{"-count", "3", "-log-format", "json"}, mapEnv(env), nil, io.Discard, &stderr); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(stderr.String(), `"Name":"jetinbox.publish"`); got != traceOn {
			t.Fatalf("tracing %v: spans printed = %v\n%s", traceOn, got, stderr.String())
		}
	}
}

// commandPipeline starts a nats-server and a migrated database and publishes
// n intents with the producer command.
func commandPipeline(t *testing.T, n int, prefix string) (*testenv.NATS, string, *pgxpool.Pool, jetstream.JetStream) {
	t.Helper()
	ctx := context.Background()
	srv := testenv.NewNATS(t, testenv.NATSOptions{})
	dbURL := testenv.NewDatabase(t)
	if err := Migrate(ctx, nil, mapEnv(map[string]string{"DATABASE_URL": dbURL}), nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if err := pipeline.Setup(ctx, js, pool, jsinbox.StreamOptions{}, 1024); err != nil {
		t.Fatal(err)
	}
	env := mapEnv(map[string]string{"NATS_URL": srv.URL()})
	if err := Producer(ctx, []string{"-count", strconv.Itoa(n), "-prefix", prefix}, env, nil, io.Discard, io.Discard); err != nil {
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
	var out bytes.Buffer
	// Re-drives of the dead letters (kept 30 days) would stretch the
	// horizon past 30 days; this pipeline never re-drives.
	if err := Prune(ctx, []string{"-older-than", "720h", "-batch", "10", "-dlq-redrive=false"}, env, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "pruned 25 inbox rows") {
		t.Fatalf("prune: %s", out.String())
	}
}

// withEnv returns base with more variables set.
func withEnv(base map[string]string, kv ...string) Env {
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
func consumeAll(t *testing.T, js jetstream.JetStream, env Env, durable string) {
	t.Helper()
	ctx := context.Background()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() { done <- Consumer(cctx, []string{"-http", ""}, env, io.Discard, &logs) }()
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
	for _, env := range []Env{mapEnv(base), withEnv(base, "JETINBOX_SCOPE", "audit", "JETINBOX_DURABLE", "audit")} {
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
	if ExitCode(err) != 2 {
		t.Fatalf("verify -from-seq 40 -to-seq 10: %v (exit %d), want a usage error\n%s", err, ExitCode(err), out.String())
	}

	out.Reset()
	err = Verify(ctx, nil, withEnv(base, "JETINBOX_SCOPE", "ledgr"), nil, &out, io.Discard)
	first, _, _ := strings.Cut(out.String(), "\n")
	if ExitCode(err) != 1 || !strings.Contains(first, `scope "ledgr" has no inbox rows`) || !strings.Contains(first, `scopes with rows: "ledger"`) {
		t.Fatalf("verify of a scope without rows: %v (exit %d), want exit 1 and the likely cause first:\n%s", err, ExitCode(err), out.String())
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
	srv := testenv.NewNATS(t, testenv.NATSOptions{})
	dbURL := testenv.NewDatabase(t)
	if err := Migrate(ctx, nil, mapEnv(map[string]string{"DATABASE_URL": dbURL}), nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	// MaxAge 1h; 200 deliveries × (AckWait 30s + nak cap 30s) = 3h20m of
	// redeliveries outlast it; dead letters are kept 30 days.
	if err := pipeline.Setup(ctx, js, pool, jsinbox.StreamOptions{MaxAge: time.Hour, DuplicateWindow: 2 * time.Minute}, 4); err != nil {
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
		if ExitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), want) {
			t.Fatalf("prune %v: %v (exit %d), want exit 2 mentioning %q\n%s", args, err, ExitCode(err), want, out.String())
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
	srv := testenv.NewNATS(t, testenv.NATSOptions{})
	dbURL := testenv.NewDatabase(t)
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	if err := Migrate(ctx, nil, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	// A short duplicate window, also the dead-letter stream's: a second
	// dead letter for the same message would not be dropped as a copy.
	const window = time.Second
	if err := pipeline.Setup(ctx, js, pool, jsinbox.StreamOptions{DuplicateWindow: window}, 16); err != nil {
		t.Fatal(err)
	}
	pub, _ := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	intents := pipeline.Generate(pipeline.Load{Count: 100, Accounts: 16, Prefix: "rd"})
	intents = append(intents, jsinbox.Intent{ID: "rd-bad-1", Subject: "intents.x", Payload: []byte(`{"account":1,`)},
		jsinbox.Intent{ID: "rd-bad-2", Subject: "intents.x", Payload: []byte(`{"account":99999,"amount":5}`)})
	for _, in := range intents {
		if err := pub.Publish(ctx, in); err != nil {
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
	err = Replay(ctx, nil, env, nil, &out, io.Discard)
	for _, want := range []string{"dry run", "duplicates (no effect)   99", "rejected before          2", "would apply              1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry-run replay output lacks %q", want)
		}
	}
	if ExitCode(err) != 1 || t.Failed() {
		t.Fatalf("dry-run replay over a missing row: %v (exit %d), want exit 1\n%s", err, ExitCode(err), out.String())
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
	if ExitCode(err) != 2 {
		t.Fatalf("replay -from-seq 50 -to-seq 10: %v (exit %d), want a usage error\n%s", err, ExitCode(err), out.String())
	}

	out.Reset()
	err = Replay(ctx, []string{"-apply"}, env, nil, &out, io.Discard)
	if ExitCode(err) != 1 || !strings.Contains(out.String(), "applied now              1") || !strings.Contains(out.String(), "rejected before          2") {
		t.Fatalf("replay -apply over a missing row: %v (exit %d)\n%s", err, ExitCode(err), out.String())
	}
	if d, r := deadLetters(), inboxRows(); d != 2 || r != 102 {
		t.Fatalf("after replay -apply: %d dead letters (want 2, none published again), %d inbox rows (want 102)", d, r)
	}
}
