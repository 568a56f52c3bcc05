package cli

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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(childConsumerEnv) != "" {
		os.Exit(runChildConsumer())
	}
	testenv.MainNoLeaks(m)
}

func mapEnv(m map[string]string) Env { return func(k string) string { return m[k] } }

// migrate applies the inbox and ledger schemas to dbURL, as jetinbox
// migrate (package app) does.
func migrate(ctx context.Context, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pginbox.New(pool).Migrate(ctx); err != nil {
		return err
	}
	_, err = effects.Migrate(ctx, pool)
	return err
}

func TestProducerJSONL(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
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
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{SyncAlways: true})
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
		{"consumer bad byte budget", func(w io.Writer) error {
			return Consumer(context.Background(), nil, mapEnv(map[string]string{"JETINBOX_MAX_BYTES": "plenty", "DATABASE_URL": "postgres://x"}), io.Discard, w)
		}, "JETINBOX_MAX_BYTES", 2},
		{"consumer wildcard inbox prefix", func(w io.Writer) error {
			return Consumer(context.Background(), nil, mapEnv(map[string]string{"NATS_INBOX_PREFIX": "_INBOX.>", "DATABASE_URL": "postgres://x"}), io.Discard, w)
		}, "inbox prefix", 2},
		{"producer bad dup fraction", func(w io.Writer) error {
			return Producer(context.Background(), []string{"-dup-fraction", "2"}, mapEnv(nil), nil, io.Discard, w)
		}, "dup-fraction", 2},
		{"producer batch too large", func(w io.Writer) error {
			return Producer(context.Background(), []string{"-batch", "5000"}, mapEnv(nil), nil, io.Discard, w)
		}, "-batch must be within", 2},
		{"consumer nothing listening", func(w io.Writer) error {
			pg := testenv.NewDatabase(t)
			if err := migrate(context.Background(), pg); err != nil {
				return err
			}
			return Consumer(context.Background(), []string{"-http", ""}, mapEnv(map[string]string{"DATABASE_URL": pg, "NATS_URL": "nats://127.0.0.1:1"}), io.Discard, w)
		}, "connect to NATS", 1},
		{"consumer schema missing", func(w io.Writer) error {
			pg := testenv.NewDatabase(t)
			return Consumer(context.Background(), []string{"-http", ""}, mapEnv(map[string]string{"DATABASE_URL": pg}), io.Discard, w)
		}, "not migrated", 2}, // the operator must run migrate: a configuration error
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
	// The HTTP listener defaults to loopback: /metrics is not offered to
	// the network unless asked for.
	for _, want := range []string{"-database-url", "-batch", "(default 6000)", "-ack-wait", "(default 30s)", "NATS_CREDS", "-drain-timeout",
		`-http string`, `(default "127.0.0.1:8080")`, "-max-bytes", "JETINBOX_MAX_BYTES", "-inbox-prefix", "NATS_INBOX_PREFIX"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("consumer -h lacks %q", want)
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

// TestTracingOffUnlessConfigured: no spans by default; JETINBOX_TRACE=stdout
// prints them.
func TestTracingOffUnlessConfigured(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
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
func commandPipeline(t *testing.T, n int, prefix string) (*natsenv.NATS, string, *pgxpool.Pool, jetstream.JetStream) {
	t.Helper()
	ctx := context.Background()
	// Migrated as jetinbox migrate would, with accounts opened.
	e := pipelinetest.New(t, jsinbox.StreamConfig{}, 1024)
	srv, dbURL, pool, js := e.NATS, e.DBURL, e.Pool, e.JS
	env := mapEnv(map[string]string{"NATS_URL": srv.URL()})
	if err := Producer(ctx, []string{"-count", strconv.Itoa(n), "-prefix", prefix}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	return srv, dbURL, pool, js
}
