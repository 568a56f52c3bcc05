package jsinbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
