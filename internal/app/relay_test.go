package app

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

// runUntil runs a long-running command until done reports true, then stops
// it; the command must return nil.
func runUntil(t *testing.T, name string, run func(ctx context.Context, stderr io.Writer) error, done func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	var logs bytes.Buffer
	go func() { errc <- run(ctx, &logs) }()
	deadline := time.Now().Add(time.Minute)
	for !done() {
		if time.Now().After(deadline) {
			cancel()
			<-errc
			t.Fatalf("%s: not done within a minute\n%s", name, logs.String())
		}
		select {
		case err := <-errc:
			t.Fatalf("%s stopped early: %v\n%s", name, err, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("%s: %v\n%s", name, err, logs.String())
	}
}

func pendingRows(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE sent_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func settled(js jetstream.JetStream, stream, durable string) func() bool {
	return func() bool {
		// One look, bounded so that a slow answer is looked at again
		// rather than waited on forever; the callers poll with their own
		// ceiling.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return pipeline.WaitSettled(ctx, js, stream, durable, nil) == nil
	}
}

// TestTwoHopCommands runs the two-hop pipeline with the commands an
// operator would run: the consumer of INTENTS with -follow-ups and -relay
// writes a notification per credit to the outbox in its inbox transaction
// and relays it to NOTIFICATIONS; a second consumer applies them under its
// own scope; verify -next-stream checks the chain, and goes red for a
// notification without an applied parent. jetinbox relay, on its own,
// sends a service's own outbox row.
func TestTwoHopCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, dbURL, pool, js := commandPipeline(t, 400, "th")
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	var out bytes.Buffer
	if err := Migrate(ctx, nil, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "2 outbox migrations") {
		t.Fatalf("migrate: %v: %s", err, out.String())
	}
	// Follow-ups without a stream to relay into: a usage error.
	err := cli.Consumer(ctx, []string{"-http", "", "-relay"}, env, io.Discard, io.Discard)
	if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "NOTIFICATIONS not found") {
		t.Fatalf("consumer -relay without its stream: %v (exit %d)", err, cli.ExitCode(err))
	}
	if err := cli.EnsureRelayStream(ctx, js, cli.DefaultRelayStream, cli.DefaultFollowUpPrefix, false); err != nil {
		t.Fatal(err)
	}
	runUntil(t, "consumer -follow-ups -relay", func(ctx context.Context, stderr io.Writer) error {
		return cli.Consumer(ctx, []string{"-http", "", "-follow-ups", "notifications", "-relay"}, env, io.Discard, stderr)
	}, func() bool { return settled(js, "INTENTS", "ledger")() && pendingRows(t, pool) == 0 })
	next := withEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL}, "JETINBOX_STREAM", "NOTIFICATIONS", "JETINBOX_SCOPE", "notifications", "JETINBOX_DURABLE", "notifications")
	runUntil(t, "consumer of NOTIFICATIONS", func(ctx context.Context, stderr io.Writer) error {
		return cli.Consumer(ctx, []string{"-http", ""}, next, io.Discard, stderr)
	}, settled(js, "NOTIFICATIONS", "notifications"))

	out.Reset()
	if err := Verify(ctx, []string{"-next-stream", "NOTIFICATIONS", "-next-scope", "notifications"}, env, nil, &out, io.Discard); err != nil {
		t.Fatalf("verify the chain: %v\n%s", err, out.String())
	}
	for _, want := range []string{`applied parents +400`, `follow-ups in NOTIFICATIONS +400`, `lost +0 +ok`, `without applied parent +0 +ok`, `applied once by notifications +400`, `duplicated +0 +ok`} {
		if !regexp.MustCompile(`(?m)^ *` + want).MatchString(out.String()) {
			t.Errorf("verify output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := Verify(ctx, nil, next, nil, &out, io.Discard); err != nil {
		t.Fatalf("verify of the second hop: %v\n%s", err, out.String())
	}

	// A service's own row, sent by jetinbox relay on its own.
	if err := pgoutbox.Add(ctx, pool, inbox.Intent{ID: "order-1", Subject: "notifications.orders", Payload: []byte(`{"account":1,"amount":1}`)}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var metrics string
	runUntil(t, "jetinbox relay", func(ctx context.Context, stderr io.Writer) error {
		return Jetinbox(ctx, []string{"relay", "-http", addr}, env, nil, io.Discard, stderr)
	}, func() bool {
		if pendingRows(t, pool) > 0 {
			return false
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		metrics = string(b)
		return strings.Contains(metrics, "jetinbox_outbox_sent_total 1\n")
	})
	problems, err := promlint.New(strings.NewReader(metrics)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
	}
	for _, want := range []string{"jetinbox_outbox_pending_rows 0", "jetinbox_outbox_oldest_pending_seconds 0", "jetinbox_outbox_emit_to_publish_seconds_count 1", "jetinbox_outbox_failed_total 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("relay /metrics lacks %q:\n%s", want, metrics)
		}
	}

	// Something in NOTIFICATIONS that no applied intent emitted: red.
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "notifications.3", Data: []byte(`{"account":3,"amount":1}`), Header: nats.Header{jetstream.MsgIDHeader: []string{"notify:ghost"}}}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = Verify(ctx, []string{"-next-stream", "NOTIFICATIONS"}, env, nil, &out, io.Discard)
	if cli.ExitCode(err) != 1 || !regexp.MustCompile(`(?m)^ *without applied parent +2 +VIOLATION`).MatchString(out.String()) {
		t.Fatalf("verify with a follow-up of no parent (and the service's own order-1): %v (exit %d)\n%s", err, cli.ExitCode(err), out.String())
	}
}

// TestRelayOnSQLite: migrate puts the outbox in a SQLite file too; a
// service's row added there with sqliteoutbox.Add in its own transaction is
// published by jetinbox relay, which polls (SQLite has no notifications).
// The relay creates its stream in fast mode, which allows fast batches.
func TestRelayOnSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	path := filepath.Join(t.TempDir(), "service.db")
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": "sqlite://" + path})
	if err := Migrate(ctx, nil, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	db, err := sqliteinbox.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sqliteoutbox.Add(ctx, tx, inbox.Intent{ID: "charge-o-1", Subject: "orders.charge", Payload: []byte(`{"cents":1250}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	db.Close()
	var info *jetstream.StreamInfo
	runUntil(t, "jetinbox relay on SQLite", func(ctx context.Context, stderr io.Writer) error {
		return Jetinbox(ctx, []string{"relay", "-http", "", "-stream", "ORDERS", "-create-stream", "orders", "-publish", "fast"}, env, nil, io.Discard, stderr)
	}, func() bool {
		s, err := js.Stream(ctx, "ORDERS")
		if err == nil {
			info, err = s.Info(ctx)
		}
		return err == nil && info.State.Msgs == 1
	})
	if !info.Config.AllowBatchPublish {
		t.Fatal("relay -create-stream -publish fast made a stream without allow_batched: its fast batches would fall back to atomic")
	}
	if info.Config.Subjects[0] != "orders.>" {
		t.Fatalf("stream captures %q, want orders.>", info.Config.Subjects)
	}
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, 1)
	if err != nil || m.Header.Get(jetstream.MsgIDHeader) != "charge-o-1" {
		t.Fatalf("ORDERS holds %v, %v", m, err)
	}
}

// TestTwoHopCommandsOnSQLite: the two-hop pipeline on a SQLite file, with
// the operator's commands: the consumer with -follow-ups and -relay adds a
// notification per credit to the SQLite outbox in its inbox transaction and
// relays it; a second consumer applies them; verify -next-stream checks the
// chain on SQLite and goes red for a notification without an applied parent.
func TestTwoHopCommandsOnSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	path := filepath.Join(t.TempDir(), "twohop.db")
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": "sqlite://" + path})
	if err := Migrate(ctx, nil, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	js := openAccountsAndStream(t, env, srv.URL())
	if err := cli.EnsureRelayStream(ctx, js, cli.DefaultRelayStream, cli.DefaultFollowUpPrefix, false); err != nil {
		t.Fatal(err)
	}
	if err := cli.Producer(ctx, []string{"-count", "300", "-prefix", "sth"}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	db, err := sqliteinbox.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	pending := func() int {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	runUntil(t, "consumer -follow-ups -relay on SQLite", func(ctx context.Context, stderr io.Writer) error {
		return cli.Consumer(ctx, []string{"-http", "", "-follow-ups", "notifications", "-relay"}, env, io.Discard, stderr)
	}, func() bool { return settled(js, "INTENTS", "ledger")() && pending() == 0 })
	var rows int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE id = 'notify:' || parent_id`).Scan(&rows); err != nil || rows != 300 {
		t.Fatalf("%d follow-ups in the SQLite outbox (%v), want 300", rows, err)
	}
	next := withEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": "sqlite://" + path}, "JETINBOX_STREAM", "NOTIFICATIONS", "JETINBOX_SCOPE", "notifications", "JETINBOX_DURABLE", "notifications")
	runUntil(t, "consumer of NOTIFICATIONS on SQLite", func(ctx context.Context, stderr io.Writer) error {
		return cli.Consumer(ctx, []string{"-http", ""}, next, io.Discard, stderr)
	}, settled(js, "NOTIFICATIONS", "notifications"))

	var out bytes.Buffer
	if err := Verify(ctx, []string{"-next-stream", "NOTIFICATIONS", "-next-scope", "notifications"}, env, nil, &out, io.Discard); err != nil {
		t.Fatalf("verify the chain on SQLite: %v\n%s", err, out.String())
	}
	for _, want := range []string{`applied parents +300`, `follow-ups in NOTIFICATIONS +300`, `lost +0 +ok`, `without applied parent +0 +ok`, `applied once by notifications +300`, `duplicated +0 +ok`} {
		if !regexp.MustCompile(`(?m)^ *` + want).MatchString(out.String()) {
			t.Errorf("verify output lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "notifications.3", Data: []byte(`{"account":3,"amount":1}`), Header: nats.Header{jetstream.MsgIDHeader: []string{"notify:ghost"}}}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = Verify(ctx, []string{"-next-stream", "NOTIFICATIONS"}, env, nil, &out, io.Discard)
	if cli.ExitCode(err) != 1 || !regexp.MustCompile(`(?m)^ *without applied parent +1 +VIOLATION`).MatchString(out.String()) {
		t.Fatalf("verify with a follow-up of no parent on SQLite: %v (exit %d)\n%s", err, cli.ExitCode(err), out.String())
	}
}
