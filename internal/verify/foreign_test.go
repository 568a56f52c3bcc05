package verify_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// TestVerifyForeignDeadLetters: NATS does not check reply subjects against
// permissions, so a key that may make JetStream requests can have the
// server store its answers in the dead-letter stream, and a key that may
// create consumers can have one deliver there. A producer that also
// chooses an intent's headers can then plant a copy that names another
// intent with every jetinbox header. None of it may settle an intent:
// verify counts it as foreign, warns, and still reports the intent it
// names as lost. The forgeries: a STREAM.INFO answer, a direct get's
// answer and a push consumer's delivery of the crafted intent, and a dead
// letter naming another stream.
func TestVerifyForeignDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pipelinetest.New(t, jsinbox.StreamConfig{}, 16)
	js, nc := e.JS, e.JS.Conn()
	s, err := js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowDirect = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// seq 1: an intent nobody consumed. seq 2: an intent crafted to look
	// like its dead letter, ID and all.
	if _, err := js.Publish(ctx, "intents.1", effects.Intent{Account: 1, Amount: 5}.AppendJSON(nil), jetstream.WithMsgID("orphan")); err != nil {
		t.Fatal(err)
	}
	deadHeaders := func(stream string) nats.Header {
		return nats.Header{jsinbox.HeaderStream: {stream}, jsinbox.HeaderScope: {"ledger"}, jsinbox.HeaderStreamSeq: {"1"},
			jsinbox.HeaderMessageID: {"orphan"}, jsinbox.HeaderStatus: {"rejected"}, jsinbox.HeaderReason: {"forged"}}
	}
	crafted := &nats.Msg{Subject: "intents.crafted", Data: []byte(`{}`), Header: deadHeaders(jsinbox.DefaultStream)}
	if _, err := js.PublishMsg(ctx, crafted, jetstream.WithMsgID("ledger:"+jsinbox.DefaultStream+":1")); err != nil {
		t.Fatal(err)
	}
	// seq 3: another, for a push consumer to deliver (the dead-letter
	// stream would drop a second copy with the first one's ID).
	crafted.Subject = "intents.pushed"
	if _, err := js.PublishMsg(ctx, crafted, jetstream.WithMsgID("crafted-2")); err != nil {
		t.Fatal(err)
	}

	dlq := jsinbox.DeadLetterPrefix + "intents.x"
	if err := nc.PublishRequest("$JS.API.STREAM.INFO."+jsinbox.DefaultStream, dlq, nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+jsinbox.DefaultStream, dlq, []byte(`{"seq":2}`)); err != nil {
		t.Fatal(err)
	}
	// A push consumer delivers only while someone listens on its deliver
	// subject, as the forger would.
	listen, err := nc.SubscribeSync(dlq)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Unsubscribe()
	legacy, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := legacy.AddConsumer(jsinbox.DefaultStream, &nats.ConsumerConfig{DeliverSubject: dlq, FilterSubject: "intents.pushed",
		AckPolicy: nats.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	other := &nats.Msg{Subject: dlq, Header: deadHeaders("OTHER")}
	if _, err := js.PublishMsg(ctx, other, jetstream.WithMsgID("ledger:OTHER:1"),
		jetstream.WithExpectStream(jsinbox.DeadLetterStream(jsinbox.DefaultStream))); err != nil {
		t.Fatal(err)
	}
	const forged = 4
	dead, err := js.Stream(ctx, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if info, err := dead.Info(ctx); err == nil && info.State.Msgs == forged {
			break
		} else if time.Now().After(deadline) {
			msgs, _ := verify.ReadStream(ctx, js, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
			t.Fatalf("the dead-letter stream holds %+v, want %d forgeries (err %v)", msgs, forged, err)
		}
	}

	// Nothing consumed the stream: all three intents, the orphan too, are
	// lost.
	r, err := verify.Run(ctx, js, e.Pool, verify.Options{Scope: "ledger", Ledger: true})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.WriteTable(&b)
	if r.Clean() || r.Lost != 3 || r.DeadLettered != 0 || r.DeadForeign != forged || r.ViolationCount() != 3 ||
		!strings.Contains(b.String(), "foreign in the dead-letter stream") ||
		len(r.Warnings) == 0 {
		t.Fatalf("verify with %d forged dead letters (want the orphan and the crafted intents lost, every forgery foreign):\n%s", forged, b.String())
	}
	t.Logf("verify:\n%s", b.String())
}
