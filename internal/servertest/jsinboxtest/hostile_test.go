package jsinboxtest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// TestHostileInput sends what a broken or hostile producer might: every
// message ends applied or dead-lettered with a reason, neighbours are applied,
// nothing twice, nothing crashes or hangs.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	good := load(100, "ok")
	e.publish(t, good[:50])
	deep := strings.Repeat(`{"a":`, 500) + "1" + strings.Repeat("}", 500)
	hostile := []struct{ id, payload, reason string }{
		// As big as the stream takes: over the ledger's limit, so rejected.
		{"big", `{"account":1,"amount":5}` + strings.Repeat(" ", jsinbox.DefaultMaxMsgSize-200), "exceeds 4096"},
		{strings.Repeat("x", 300), `{"account":1,"amount":5}`, "more than 200"},
		{"dup-keys", `{"account":1,"amount":5,"amount":500}`, "duplicate key"},
		{"case-keys", `{"Account":1,"amount":5}`, `unknown field "Account"`},
		{"deep", `{"account":1,"amount":` + deep + `}`, "must be an integer"},
		{"huge", `{"account":1,"amount":123456789012345678901234567890}`, "out of range"},
		{"utf8", "{\"account\":1,\"amount\":5,\"memo\":\"\xff\xfe\"}", "not valid UTF-8"},
		{"trailing", `{"account":1,"amount":5} garbage`, "trailing data"},
		{"nul-id\x00", `{"account":1,"amount":5}`, "control"},
	}
	for _, h := range hostile {
		e.publishRaw(t, "intents.h", h.id, []byte(h.payload))
	}
	// Bigger than the stream's max_msg_size: refused at the door, never
	// stored, never held by a consumer.
	_, err := e.js.Publish(context.Background(), "intents.h", make([]byte, jsinbox.DefaultMaxMsgSize+1), jetstream.WithMsgID("too-big"))
	if !errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
		t.Fatalf("publishing %d bytes: %v, want the stream's max_msg_size to refuse it", jsinbox.DefaultMaxMsgSize+1, err)
	}
	// An empty ID header is as good as none.
	m := &nats.Msg{Subject: "intents.h", Data: []byte(`{"account":1,"amount":5}`), Header: nats.Header{jetstream.MsgIDHeader: []string{""}}}
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	e.publish(t, good[50:])

	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 32})
	e.settle(t, time.Minute)
	rep := e.assertClean(t, 100)
	if want := len(hostile) + 1; rep.DeadLettered != want || r.c.Stats().DeadLettered != int64(want) {
		t.Fatalf("dead-lettered %d (stats %d), want %d", rep.DeadLettered, r.c.Stats().DeadLettered, want)
	}
	dead, err := verify.ReadStream(context.Background(), e.js, jsinbox.DefaultStream+"_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range append(hostile, struct{ id, payload, reason string }{"", "", "empty"}) {
		found := false
		for _, d := range dead {
			found = found || strings.Contains(d.Header[jsinbox.HeaderReason], h.reason)
		}
		if !found {
			t.Errorf("no dead letter with reason %q", h.reason)
		}
	}
}

// TestDangerousHeadersRefused: headers that could delete or expire intents
// are refused by the stream the project ships.
func TestDangerousHeadersRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	e.publish(t, load(5, "keep"))
	for _, h := range []nats.Header{
		{"Nats-Rollup": []string{"all"}},
		{"Nats-Rollup": []string{"sub"}},
		{"Nats-TTL": []string{"1s"}},
		{"Nats-Schedule": []string{"@every 1s"}, "Nats-Schedule-Target": []string{"intents.x"}},
	} {
		h.Set(jetstream.MsgIDHeader, "hostile")
		_, err := e.js.PublishMsg(context.Background(), &nats.Msg{Subject: "intents.x", Data: []byte(`{}`), Header: h})
		if err == nil {
			t.Errorf("stream accepted a message with headers %v", h)
		}
	}
	s, err := e.js.Stream(context.Background(), jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := s.Info(context.Background())
	if info.State.Msgs != 5 {
		t.Fatalf("stream holds %d messages after the hostile publishes, want the 5 intents", info.State.Msgs)
	}
}

// TestPullStormBounded: a flood of pull requests cannot take more messages
// than MaxAckPending allows, and the real consumer still settles the stream.
func TestPullStormBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	if _, err := e.js.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy,
		MaxAckPending: 50, MaxWaiting: 16, MaxDeliver: 20, AckWait: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	e.publish(t, load(500, "storm"))
	cons, err := e.js.Consumer(ctx, jsinbox.DefaultStream, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	held := 0
	var wg sync.WaitGroup
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := cons.Fetch(10, jetstream.FetchMaxWait(500*time.Millisecond))
			if err != nil {
				return
			}
			for range b.Messages() { // never acked
				mu.Lock()
				held++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if held > 50 {
		t.Fatalf("a pull storm took %d unacked messages past MaxAckPending 50", held)
	}
	e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{})
	e.settle(t, time.Minute)
	e.assertClean(t, 500)
}

// ownConn gives the consumer a NATS connection of its own, which the test
// can watch and close without touching the env's.
func ownConn(t *testing.T, e *env, got **nats.Conn) func(jetstream.JetStream) jetstream.JetStream {
	return func(jetstream.JetStream) jetstream.JetStream {
		nc, err := nats.Connect(e.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		*got = nc
		return js
	}
}

// TestLongSubjectDoesNotStopTheConsumer: an intent on a subject near the
// server's control-line limit (4,096 bytes by default), with a body the
// effect rejects. Echoed into the dead-letter publish's control line it
// would exceed the limit, the server would close the consumer's connection
// and nats.go would not reopen it: nothing after it applied, by any
// replica. The inbox rejects a subject over inbox.MaxSubjectLen, the dead
// letter's subject is bounded, and the original subject is named by its
// hash; the consumer's connection stays up and the intents after it are
// applied.
func TestLongSubjectDoesNotStopTheConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	// Published without a reply subject (no PubAck wanted), so that its
	// own control line fits, and the dead letter's, with "dlq." and a reply
	// inbox more, would not.
	long := "intents." + strings.Repeat("x", 4052)
	lm := &nats.Msg{Subject: long, Data: []byte(`{"account":1,"amount":"not a number"}`), Header: nats.Header{jetstream.MsgIDHeader: {"long-subject"}}}
	if err := e.nc.PublishMsg(lm); err != nil {
		t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The server stores it after the flush's round trip, through the
	// stream's own queue: wait for it.
	for deadline := time.Now().Add(30 * time.Second); streamMsgs(t, e.js, jsinbox.DefaultStream) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the stream holds %d messages, want the long-subject one", streamMsgs(t, e.js, jsinbox.DefaultStream))
		}
	}
	// At the inbox's limit: kept whole, rejected by the effect.
	edge := "intents." + strings.Repeat("y", inbox.MaxSubjectLen-len("intents."))
	e.publishRaw(t, edge, "edge-subject", []byte(`{"account":1,"amount":"not a number"}`))
	good := load(100, "after")
	e.publish(t, good)

	var nc *nats.Conn
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{BatchSize: 8}, ownConn(t, e, &nc))
	e.settle(t, time.Minute)
	if nc.IsClosed() {
		t.Fatalf("the consumer's connection was closed: %v", nc.LastError())
	}
	rep := e.assertClean(t, 100)
	if rep.DeadLettered != 2 || r.c.Stats().DeadLettered != 2 {
		t.Fatalf("dead-lettered %d (stats %d), want 2", rep.DeadLettered, r.c.Stats().DeadLettered)
	}
	dlq, err := e.js.Stream(context.Background(), jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*nats.Msg{}
	for seq := uint64(1); seq <= 2; seq++ {
		raw, err := dlq.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		if len(raw.Subject) > len(jsinbox.DeadLetterPrefix)+inbox.MaxSubjectLen {
			t.Errorf("dead-letter subject of %d bytes", len(raw.Subject))
		}
		byID[raw.Header.Get(jsinbox.HeaderMessageID)] = &nats.Msg{Subject: raw.Subject, Header: raw.Header}
	}
	l := byID["long-subject"]
	if l == nil || l.Header.Get(jsinbox.HeaderSubjectSHA256) == "" || !strings.Contains(l.Header.Get(jsinbox.HeaderReason), "more than 256") ||
		!strings.HasPrefix(long, l.Header.Get(jsinbox.HeaderSubject)) {
		t.Fatalf("long subject's dead letter: %+v", l)
	}
	if got, ok := jsinbox.OriginalSubject(l); ok || got != "" {
		t.Errorf("OriginalSubject of a long one: %q, %v; want none", got, ok)
	}
	d := byID["edge-subject"]
	if got, ok := jsinbox.OriginalSubject(d); d == nil || d.Subject != jsinbox.DeadLetterPrefix+edge || !ok || got != edge {
		t.Errorf("edge subject's dead letter: %+v, original %q", d, got)
	}
}

// TestClosedConnectionEndsTheConsumer: a connection nats.go has closed for
// good (a protocol error the server closed it for, or Close) is never
// reopened. The consumer must end with an error saying so, for a
// supervisor to restart it, not loop on binding the durable again.
func TestClosedConnectionEndsTheConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	var nc *nats.Conn
	r := e.startConsumer(t, nil, nil, jsinbox.ConsumerConfig{}, ownConn(t, e, &nc))
	deadline := time.Now().Add(30 * time.Second)
	for !r.c.Ready() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	nc.Close()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		if !errors.Is(err, nats.ErrConnectionClosed) || !strings.Contains(err.Error(), "closed for good") {
			t.Fatalf("Run: %v, want an error saying the connection is closed for good", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer did not end within 30s of its connection closing")
	}
	if r.c.Ready() {
		t.Error("ready after its connection closed")
	}
}
