package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestConsumerCommandThroughFailover runs the consumer command on a
// pg_auto_failover primary with a synchronous standby, through the
// multi-host URL with target_session_attrs=read-write, and kills the
// primary while intents flow: /readyz says 503 while no node takes writes,
// 200 once the standby is promoted, and every intent is applied once.
func TestConsumerCommandThroughFailover(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewAutoFailover(t, testenv.AutoFailoverOptions{})
	dbURL, err := f.CreateDatabase(ctx, "cli_failover")
	if err != nil {
		t.Fatal(err)
	}
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pipeline.Setup(ctx, js, pool, jsinbox.StreamConfig{}, 64); err != nil {
		t.Fatal(err)
	}
	env := mapEnv(map[string]string{"NATS_URL": srv.URL()})
	publish := func(prefix string) {
		t.Helper()
		if err := Producer(ctx, []string{"-count", "200", "-accounts", "64", "-prefix", prefix}, env, nil, io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	publish("before")

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	logs := testenv.NewLogTail(200)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the consumer's last lines:\n%s", logs)
		}
	})
	go func() {
		done <- Consumer(cctx, []string{"-http", addr, "-ack-wait", "5s"},
			mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL}), io.Discard, logs)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()
	ready := func() int {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitReady := func(want int, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for ready() != want {
			if time.Now().After(deadline) {
				t.Fatalf("/readyz never answered %d within %v", want, within)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitReady(http.StatusOK, 30*time.Second)
	p, err := f.WaitPrimary(ctx, 2*time.Minute)
	if err != nil || p < 0 {
		t.Fatalf("primary %d: %v", p, err)
	}
	f.KillNode(p)
	publish("during")
	waitReady(http.StatusServiceUnavailable, time.Minute)
	waitReady(http.StatusOK, 2*time.Minute)
	if q, err := f.WaitPrimary(ctx, 2*time.Minute); err != nil || q != 1-p {
		t.Fatalf("primary after the kill: %d (%v), want %s", q, err, f.Name(1-p))
	}
	publish("after")
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	if err := pipeline.WaitSettled(wctx, js, jsinbox.DefaultStream, "ledger", nil); err != nil {
		t.Fatal(err)
	}
	pool.Reset() // its connections went with the old primary
	var n, ids int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM ledger_entries`).Scan(&n, &ids); err != nil {
		t.Fatal(err)
	}
	if n != 600 || ids != 600 {
		t.Fatalf("ledger has %d entries of %d IDs, want 600 of 600 (%s killed)", n, ids, f.Name(p)+" "+strconv.Itoa(p))
	}
}
