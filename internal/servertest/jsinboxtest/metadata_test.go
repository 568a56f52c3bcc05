package jsinboxtest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
)

// TestDeliveryMetadataReachesTheInbox: what the consumer reads of each
// delivery (the delivery count, the stream sequence, when the stream stored
// it) reaches the handler as JetStream sent it, and the delivery count
// decides the last delivery: a message that keeps failing for a passing
// reason is seen on deliveries 1, 2 and 3 and, on the third (MaxDeliver),
// dead-lettered as given up after 3 deliveries.
func TestDeliveryMetadataReachesTheInbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	before := time.Now().Add(-time.Minute)
	e.publishRaw(t, "intents.1", "steady", []byte(`{"account":1,"amount":5}`))
	e.publishRaw(t, "intents.1", "flaky", []byte(`{"account":1,"amount":7}`))
	after := time.Now().Add(time.Minute)

	var mu sync.Mutex
	seen := map[string][]inbox.Message{}
	h := inbox.HandlerFunc(func(_ context.Context, _ pgx.Tx, m inbox.Message) error {
		mu.Lock()
		seen[m.ID] = append(seen[m.ID], m)
		mu.Unlock()
		if m.ID == "flaky" {
			return errors.New("passing trouble")
		}
		return nil
	})
	e.startConsumer(t, nil, h, jsinbox.ConsumerConfig{MaxDeliver: 3,
		Nak: jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond}})

	var dead []verify.Message
	for deadline := time.Now().Add(30 * time.Second); len(dead) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no dead letter within 30s")
		}
		var err error
		if dead, err = verify.ReadStream(context.Background(), e.js, jsinbox.DefaultStream+"_DLQ"); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	steady, flaky := seen["steady"], seen["flaky"]
	if len(steady) == 0 || steady[0].Deliveries != 1 || steady[0].StreamSeq != 1 {
		t.Fatalf("steady: seen as %+v, want delivery 1 of stream sequence 1", steady)
	}
	var deliveries []uint64
	for _, m := range flaky {
		if m.StreamSeq != 2 || m.Published.Before(before) || m.Published.After(after) {
			t.Errorf("flaky: stream sequence %d, stored at %v; want 2, stored between %v and %v", m.StreamSeq, m.Published, before, after)
		}
		deliveries = append(deliveries, m.Deliveries)
	}
	// A failing batch is applied again one message at a time: each
	// delivery may reach the handler twice, never with another count.
	var distinct []uint64
	for _, d := range deliveries {
		if len(distinct) == 0 || distinct[len(distinct)-1] != d {
			distinct = append(distinct, d)
		}
	}
	if len(distinct) != 3 || distinct[0] != 1 || distinct[1] != 2 || distinct[2] != 3 {
		t.Fatalf("flaky: the handler saw deliveries %v, want 1, 2, 3", deliveries)
	}
	d := dead[0]
	if got := d.Header[jsinbox.HeaderDelivered]; got != "3" {
		t.Errorf("dead letter: %s %q, want 3", jsinbox.HeaderDelivered, got)
	}
	if got := d.Header[jsinbox.HeaderStreamSeq]; got != strconv.Itoa(2) {
		t.Errorf("dead letter: %s %q, want 2", jsinbox.HeaderStreamSeq, got)
	}
	if r := d.Header[jsinbox.HeaderReason]; !strings.Contains(r, "gave up after 3 deliveries") {
		t.Errorf("dead letter: reason %q, want one that gave up after 3 deliveries", r)
	}
}
