package app

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
)

// TestDLQRedrive: poison → dead letter → fix → re-drive → applied once.
// An intent for an account that does not exist is dead-lettered; the
// operator lists it, opens the account, re-drives it, and the inbox
// applies it once; a second re-drive finds it applied and publishes
// nothing; verify is clean.
func TestDLQRedrive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pipelinetest.Start(t)
	srv, dbURL, pool, js := e.NATS, e.DBURL, e.Pool, e.JS
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	const window = 500 * time.Millisecond
	if err := pipeline.Setup(ctx, js, pool, jsinbox.StreamConfig{DuplicateWindow: window}, 10); err != nil {
		t.Fatal(err)
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
	var bal int64
	if err := pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 999`).Scan(&bal); err != nil || bal != 42 {
		t.Fatalf("account 999 balance %d, %v: want the re-driven 42", bal, err)
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
	var entries int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE message_id = 'to-999'`).Scan(&entries); err != nil || entries != 1 {
		t.Fatalf("%d ledger entries for the re-driven intent, want 1", entries)
	}
}
