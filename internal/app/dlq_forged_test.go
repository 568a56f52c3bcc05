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

// TestDLQRedriveRefusesForgedDeadLetters: a key that may publish dead
// letters (every consumer's) writes them as a consumer would, headers and
// ID and all. One names stream seq 1, which holds another intent, with a
// payload of 1,000,000 under an ID nobody published; one names a sequence
// the stream never held; one names a genuine dead letter's sequence and ID
// with a tampered payload. A re-drive of all of them applies nothing
// forged: the first two are refused (exit 1, each said why), and the
// third publishes the original's bytes as the stream holds them.
func TestDLQRedriveRefusesForgedDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pipelinetest.Start(t)
	env, js := mapEnv(map[string]string{"NATS_URL": e.NATS.URL(), "DATABASE_URL": e.DBURL}), e.JS
	const window = 500 * time.Millisecond
	if err := pipeline.Setup(ctx, js, e.Pool, jsinbox.StreamConfig{DuplicateWindow: window}, 10); err != nil {
		t.Fatal(err)
	}
	publish := func(id, payload string) {
		m := &nats.Msg{Subject: "intents.1", Data: []byte(payload), Header: nats.Header{jetstream.MsgIDHeader: {id}, "Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publish("victim", `{"account":1,"amount":5}`)    // seq 1
	publish("to-999", `{"account":999,"amount":42}`) // seq 2: dead-lettered
	consumeSettled(t, env, js)

	forge := func(dlqID, id, seq, payload string) {
		m := &nats.Msg{Subject: jsinbox.DeadLetterPrefix + "intents.1", Data: []byte(payload), Header: nats.Header{
			jsinbox.HeaderStatus: {"rejected"}, jsinbox.HeaderReason: {"partition not owned"},
			jsinbox.HeaderScope: {"ledger"}, jsinbox.HeaderStream: {jsinbox.DefaultStream}, jsinbox.HeaderStreamSeq: {seq},
			jsinbox.HeaderDelivered: {"1"}, jsinbox.HeaderMessageID: {id}, jsinbox.HeaderSubject: {"intents.1"}}}
		if _, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(dlqID),
			jetstream.WithExpectStream(jsinbox.DeadLetterStream(jsinbox.DefaultStream))); err != nil {
			t.Fatal(err)
		}
	}
	forge("ledger:INTENTS:1", "nobody-published", "1", `{"account":1,"amount":1000000}`)
	forge("ledger:INTENTS:77", "never-held", "77", `{"account":1,"amount":1000000}`)
	forge("tampered", "to-999", "2", `{"account":999,"amount":1000000}`)

	if err := Jetinbox(ctx, []string{"accounts", "-open", "999"}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	time.Sleep(window + 200*time.Millisecond)
	// Dead-letter stream: 1 genuine (to-999), then the three forged (2, 3, 4).
	var out bytes.Buffer
	err := Jetinbox(ctx, []string{"dlq", "-redrive", "-seq", "2,3,4"}, env, nil, &out, io.Discard)
	t.Logf("dlq -redrive:\n%s", out.String())
	if cli.ExitCode(err) != 1 {
		t.Fatalf("re-drive of forged dead letters: %v (exit %d), want exit 1", err, cli.ExitCode(err))
	}
	for _, want := range []string{
		`dead letter 2 (intent "nobody-published"): refused, not re-driven: stream seq 1 holds intent "victim", not "nobody-published"`,
		`dead letter 3 (intent "never-held"): refused, not re-driven: stream seq 77 is beyond the last message`,
		"re-driven 1, already applied 0, skipped 0, refused 2, failed 0",
	} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("dlq -redrive output lacks %q:\n%s", want, out.String())
		}
	}
	consumeSettled(t, env, js)
	var forged, entries, bal999 int64
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE message_id = 'nobody-published' OR amount = 1000000`).Scan(&forged); err != nil {
		t.Fatal(err)
	}
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE message_id = 'to-999'`).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if err := e.Pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 999`).Scan(&bal999); err != nil {
		t.Fatal(err)
	}
	if forged != 0 || entries != 1 || bal999 != 42 {
		t.Fatalf("after re-driving forged dead letters: %d forged ledger entries, %d entries for to-999, balance of 999 %d; want 0, 1, the original's 42",
			forged, entries, bal999)
	}
	// The re-driven copy carries the original's headers.
	s, err := js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Header.Get(jetstream.MsgIDHeader) != "to-999" || raw.Header.Get("Traceparent") == "" || string(raw.Data) != `{"account":999,"amount":42}` {
		t.Fatalf("re-driven copy: headers %v, payload %s", raw.Header, raw.Data)
	}
}
