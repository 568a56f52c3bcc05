package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// TestCommandsThroughPgBouncer: a real pgbouncer in transaction pooling
// mode, with two server connections for a consumer pool of six and four
// batches in flight, so that every client's transactions run on whichever
// server connection is free. The commands find the pooler and run without
// named prepared statements: migrate, accounts, the consumer, verify,
// replay, dlq and prune work through it, every intent applied once, verify
// clean. The relay, whose LISTEN a pooler cannot carry, refuses to start
// without a direct URL for it or -no-listen, and works with either.
func TestCommandsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n, window = 3000, 500 * time.Millisecond
	direct := testenv.NewDatabase(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	bouncer := testenv.NewPgBouncer(t, testenv.PgBouncerOptions{PoolSize: 2})
	dbURL := bouncer.URL(strings.TrimPrefix(u.Path, "/")) // as an operator writes it: no statement mode
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	// The checks read the database directly, past the pooler.
	pool, err := pgxpool.New(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	count := func(q string) int {
		t.Helper()
		var c int
		if err := pool.QueryRow(ctx, q).Scan(&c); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return c
	}

	var out bytes.Buffer
	if err := Migrate(ctx, nil, env, nil, &out, io.Discard); err != nil {
		t.Fatalf("migrate through pgbouncer: %v\n%s", err, out.String())
	}
	if err := Accounts(ctx, []string{"-open", "1-1024"}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatalf("accounts through pgbouncer: %v", err)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{DuplicateWindow: window}); err != nil {
		t.Fatal(err)
	}
	// Published here rather than by the producer, which refuses a stream
	// whose duplicate window is as short as the re-drive below needs.
	for i := 1; i <= n; i++ {
		m := &nats.Msg{Subject: "intents.1", Data: fmt.Appendf(nil, `{"account":%d,"amount":%d}`, 1+i%1024, i%97+1),
			Header: nats.Header{jetstream.MsgIDHeader: {"pb-" + strconv.Itoa(i)}}}
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("publishing timed out")
	}
	// Two intents the consumer dead-letters (no such account; not JSON).
	for id, payload := range map[string]string{"to-2000": `{"account":2000,"amount":7}`, "bad-json": `{"account":1,`} {
		m := &nats.Msg{Subject: "intents.1", Data: []byte(payload), Header: nats.Header{jetstream.MsgIDHeader: {id}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	// Small batches, four in flight on six client connections over two
	// server connections.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- cli.Consumer(cctx, []string{"-http", "", "-batch", "50", "-inflight", "4", "-db-conns", "6", "-log-format", "text"}, env, io.Discard, &syncWriter{w: &logs})
	}()
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	err = pipeline.WaitSettled(wctx, js, jsinbox.DefaultStream, "ledger", nil)
	wcancel()
	cancel()
	if cerr := <-done; cerr != nil || err != nil {
		t.Fatalf("consumer through pgbouncer: %v; settled: %v\n%s", cerr, err, tail(logs.String(), 3000))
	}
	// Nothing here fails a batch: one that failed met the pooler (a
	// prepared statement another client's transaction made or lost) and
	// only succeeded on a retry.
	if strings.Contains(logs.String(), "batch failed") {
		t.Fatalf("the consumer retried batches through pgbouncer:\n%s", tail(logs.String(), 3000))
	}
	if got := count(`SELECT count(*) FROM ledger_entries WHERE message_id LIKE 'pb-%'`); got != n {
		t.Fatalf("%d ledger entries, want %d\n%s", got, n, tail(logs.String(), 3000))
	}

	out.Reset()
	if err := Verify(ctx, []string{"-json"}, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), `"applied_once": `+strconv.Itoa(n)) {
		t.Fatalf("verify through pgbouncer: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := Replay(ctx, nil, env, nil, &out, io.Discard); err != nil || !regexp.MustCompile(`duplicates \(no effect\) +`+strconv.Itoa(n)).MatchString(out.String()) {
		t.Fatalf("replay through pgbouncer: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := Jetinbox(ctx, []string{"dlq"}, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "2 dead letters") {
		t.Fatalf("dlq through pgbouncer: %v\n%s", err, out.String())
	}
	if err := Accounts(ctx, []string{"-open", "2000"}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	time.Sleep(window + 200*time.Millisecond) // the dead letter's ID is forgotten
	out.Reset()
	if err := Jetinbox(ctx, []string{"dlq", "-redrive", "-id", "to-2000"}, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "re-driven 1,") {
		t.Fatalf("dlq -redrive through pgbouncer: %v\n%s", err, out.String())
	}
	consumeSettled(t, env, js)
	if got := count(`SELECT count(*) FROM ledger_entries WHERE message_id = 'to-2000'`); got != 1 {
		t.Fatalf("re-driven intent: %d ledger entries, want 1", got)
	}
	out.Reset()
	if err := Verify(ctx, nil, env, nil, &out, io.Discard); err != nil {
		t.Fatalf("verify after the re-drive: %v\n%s", err, out.String())
	}

	if _, err := pool.Exec(ctx, `UPDATE inbox SET received_at = now() - interval '40 days' WHERE message_id LIKE 'pb-1%'`); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Prune(ctx, []string{"-older-than", "800h", "-dlq-redrive=false"}, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "pruned 1111 inbox rows") {
		t.Fatalf("prune through pgbouncer: %v\n%s", err, out.String())
	}
}

// TestRelayThroughPgBouncer: jetinbox relay (and consumer -relay) on a
// database URL that reaches a pgbouncer in transaction mode exits 2 at
// start, saying what to set; with a direct URL for the LISTEN
// (JETINBOX_LISTEN_DATABASE_URL; -listen-database through the pooler is
// refused) it takes its rows through the pooler, and with -no-listen it
// polls.
func TestRelayThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := testenv.NewDatabase(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	bouncer := testenv.NewPgBouncer(t, testenv.PgBouncerOptions{})
	dbURL := bouncer.URL(strings.TrimPrefix(u.Path, "/"))
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	if err := Migrate(ctx, nil, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.EnsureRelayStream(ctx, js, cli.DefaultRelayStream, cli.DefaultFollowUpPrefix, false); err != nil {
		t.Fatal(err)
	}
	// A service writes its rows through the pooler, as the relay reads them.
	pool, err := pgxpool.New(ctx, testenv.WithQueryExecMode(dbURL, "exec"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	add := func(id string) {
		t.Helper()
		if err := pgoutbox.Add(ctx, pool, inbox.Intent{ID: id, Subject: "notifications.1", Payload: []byte(`{"account":1,"amount":1}`)}); err != nil {
			t.Fatal(err)
		}
	}
	relay := func(ctx context.Context, stderr io.Writer, args ...string) error {
		return Jetinbox(ctx, append([]string{"relay", "-http", ""}, args...), env, nil, io.Discard, stderr)
	}

	// A relay that starts runs until its context ends: 30 s is past any
	// start-up check.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	err = relay(sctx, &stderr)
	if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "JETINBOX_LISTEN_DATABASE_URL") || !strings.Contains(err.Error(), "-no-listen") {
		t.Fatalf("relay with LISTEN through pgbouncer: %v (exit %d), want exit 2 naming JETINBOX_LISTEN_DATABASE_URL and -no-listen\n%s", err, cli.ExitCode(err), stderr.String())
	}
	// The consumer's own relay likewise, by its own flags' names.
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	err = cli.Consumer(sctx, []string{"-http", "", "-relay"}, env, io.Discard, io.Discard)
	if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "-relay-listen-database") || !strings.Contains(err.Error(), "-relay-no-listen") {
		t.Fatalf("consumer -relay through pgbouncer: %v (exit %d), want exit 2 naming -relay-listen-database and -relay-no-listen", err, cli.ExitCode(err))
	}
	if err := relay(sctx, io.Discard, "-listen-database", dbURL); cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "direct connection") {
		t.Fatalf("relay -listen-database through pgbouncer: %v (exit %d), want exit 2", err, cli.ExitCode(err))
	}

	// With the LISTEN on a direct connection a row is sent when its
	// transaction commits. Without jitter the relay, idle since it sent
	// o-1 at t0, polls at t0+1s, 3s, 7s and 15s: o-3, added at t0+8s and
	// sent by t0+11s, was sent on its notification.
	add("o-1")
	withListen := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL, "JETINBOX_LISTEN_DATABASE_URL": direct})
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	errc := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		errc <- Jetinbox(rctx, []string{"relay", "-http", "", "-jitter", "none"}, withListen, nil, io.Discard, &syncWriter{w: &logs})
	}()
	waitSent := func(within time.Duration) bool {
		for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if pendingRows(t, pool) == 0 {
				return true
			}
		}
		return false
	}
	if !waitSent(30 * time.Second) {
		t.Fatal("relay with JETINBOX_LISTEN_DATABASE_URL sent nothing in 30s")
	}
	t0 := time.Now()
	time.Sleep(time.Until(t0.Add(8 * time.Second)))
	add("o-3")
	sent := waitSent(3 * time.Second)
	rcancel()
	if err := <-errc; err != nil || !sent {
		t.Fatalf("relay with JETINBOX_LISTEN_DATABASE_URL: %v; o-3 sent on its notification: %v\n%s", err, sent, logs.String())
	}
	add("o-2")
	runUntil(t, "relay -no-listen", func(ctx context.Context, stderr io.Writer) error {
		return relay(ctx, stderr, "-no-listen")
	}, func() bool { return pendingRows(t, pool) == 0 })
	if got := pipelinetest.CopiesByID(t, js, cli.DefaultRelayStream); len(got) != 3 || got["o-1"] != 1 || got["o-2"] != 1 || got["o-3"] != 1 {
		t.Fatalf("relayed %v, want o-1, o-2 and o-3 once each", got)
	}
}

// tail is the end of s, for a failure message.
func tail(s string, max int) string {
	if len(s) > max {
		return "…" + s[len(s)-max:]
	}
	return s
}

// syncWriter serialises writes from the consumer's goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
