package app

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestDLQRedrive: poison → dead letter → fix → re-drive → applied once,
// on each store. An intent for an account that does not exist is
// dead-lettered; the operator lists it, opens the account, re-drives it,
// and the inbox applies it once; a second re-drive finds it applied and
// publishes nothing; verify is clean.
func TestDLQRedrive(t *testing.T) {
	t.Parallel()
	for _, store := range []string{cli.StorePostgres, cli.StoreSQLite} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			dlqRedrive(t, store)
		})
	}
}

func dlqRedrive(t *testing.T, store string) {
	ctx := context.Background()
	const window = 500 * time.Millisecond
	var (
		env   cli.Env
		js    jetstream.JetStream
		query func(q string) int64 // one number from the store
	)
	if store == cli.StoreSQLite {
		srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
		path := filepath.Join(t.TempDir(), "inbox.db")
		env = mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": "sqlite://" + path})
		if err := Migrate(ctx, nil, env, nil, io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
		if err := Accounts(ctx, []string{"-open", "1-10"}, env, nil, io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ = jetstream.New(nc)
		if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{DuplicateWindow: window}); err != nil {
			t.Fatal(err)
		}
		db, err := sqliteinbox.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		query = func(q string) int64 {
			var n int64
			if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			return n
		}
	} else {
		e := pipelinetest.Start(t)
		env, js = mapEnv(map[string]string{"NATS_URL": e.NATS.URL(), "DATABASE_URL": e.DBURL}), e.JS
		if err := pipeline.Setup(ctx, js, e.Pool, jsinbox.StreamConfig{DuplicateWindow: window}, 10); err != nil {
			t.Fatal(err)
		}
		query = func(q string) int64 {
			var n int64
			if err := e.Pool.QueryRow(ctx, q).Scan(&n); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			return n
		}
	}
	publish := func(id, payload string) {
		m := &nats.Msg{Subject: "intents.1", Data: []byte(payload), Header: nats.Header{jetstream.MsgIDHeader: {id}, "Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publish("ok-1", `{"account":1,"amount":5}`)
	publish("to-999", `{"account":999,"amount":42}`)
	publish("bad-json", `{"account":1,`)
	consumeSettled(t, env, js)
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := Jetinbox(ctx, append([]string{"dlq"}, args...), env, nil, &out, io.Discard)
		return out.String(), err
	}
	out, err := run()
	if err != nil || !strings.Contains(out, "2 dead letters") || !strings.Contains(out, "unknown account 999") || !strings.Contains(out, "to-999") {
		t.Fatalf("dlq list: %v\n%s", err, out)
	}
	if out, err := run("-show", "1"); err != nil || !strings.Contains(out, "reason:") || !strings.Contains(out, "Traceparent") {
		t.Fatalf("dlq -show 1: %v\n%s", err, out)
	}
	if _, err := run("-redrive"); cli.ExitCode(err) != 2 {
		t.Fatalf("-redrive without a selection: %v", err)
	}

	// Fix the cause, wait out the duplicate window, re-drive.
	if err := Jetinbox(ctx, []string{"accounts", "-open", "999"}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	time.Sleep(window + 200*time.Millisecond)
	if out, err := run("-redrive", "-id", "to-999"); err != nil || !strings.Contains(out, "re-driven 1,") {
		t.Fatalf("dlq -redrive: %v\n%s", err, out)
	}
	consumeSettled(t, env, js)
	if bal := query(`SELECT balance FROM accounts WHERE id = 999`); bal != 42 {
		t.Fatalf("account 999 balance %d: want the re-driven 42", bal)
	}
	// Applied stays applied: a second re-drive publishes nothing.
	time.Sleep(window + 200*time.Millisecond)
	if out, err := run("-redrive", "-all"); err != nil || !strings.Contains(out, "already applied 1") {
		t.Fatalf("second re-drive: %v\n%s", err, out)
	}
	consumeSettled(t, env, js)
	if err := Verify(ctx, nil, env, nil, io.Discard, io.Discard); err != nil {
		var b bytes.Buffer
		_ = Verify(ctx, nil, env, nil, &b, io.Discard)
		t.Fatalf("verify after re-drive: %v\n%s", err, b.String())
	}
	if entries := query(`SELECT count(*) FROM ledger_entries WHERE message_id = 'to-999'`); entries != 1 {
		t.Fatalf("%d ledger entries for the re-driven intent, want 1", entries)
	}
}
