package jsinboxtest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// batchEnv is an embedded server and a stream, with or without atomic
// publishing allowed.
func batchEnv(t *testing.T, atomicAllowed bool) jetstream.JetStream {
	t.Helper()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := jsinbox.StreamConfig{}.Config()
	cfg.AllowAtomicPublish = atomicAllowed
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	return js
}

// publishAll publishes intents and requires every one published; fps, if
// given, arm the publisher's points.
func publishAll(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg jsinbox.PublisherConfig, intents []inbox.Intent, fps ...*failpoint.Set) jsinbox.PublisherStats {
	t.Helper()
	p, err := jsinbox.NewPublisher(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, fp := range fps {
		fp.Attach(p)
	}
	defer p.Close()
	for _, in := range intents {
		if err := p.PublishAsync(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := p.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	if f := p.Failures(); len(f) > 0 {
		t.Fatalf("%d intents not published, first %+v", len(f), f[0])
	}
	return p.Stats()
}

// streamIDs returns how many messages the stream holds and how many
// distinct IDs among them.
func streamIDs(t *testing.T, js jetstream.JetStream) (msgs, ids int) {
	t.Helper()
	ctx := context.Background()
	c, err := js.OrderedConsumer(ctx, jsinbox.DefaultStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	total := int(info.CachedInfo().State.Msgs)
	seen := map[string]bool{}
	for msgs < total {
		b, err := c.Fetch(min(1000, total-msgs), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			msgs++
			seen[m.Headers().Get(jetstream.MsgIDHeader)] = true
		}
		if b.Error() != nil {
			t.Fatal(b.Error())
		}
	}
	return msgs, len(seen)
}

// TestAtomicBatches: intents published in atomic batches are stored once
// each.
func TestAtomicBatches(t *testing.T) {
	t.Parallel()
	js := batchEnv(t, true)
	intents := load(2500, "ab")
	st := publishAll(t, context.Background(), js, jsinbox.PublisherConfig{Batch: 500}, intents)
	// Group commit measures batches against one by one and may publish
	// part of the intents one at a time.
	if st.Published != 2500 || st.Batches < 1 || st.BatchFallbacks != 0 {
		t.Fatalf("stats %+v, want 2500 published, batches among them, no fallback", st)
	}
	if msgs, ids := streamIDs(t, js); msgs != 2500 || ids != 2500 {
		t.Fatalf("stream holds %d messages with %d IDs, want 2500", msgs, ids)
	}
}

// TestAtomicBatchWithStoredIDs: the server refuses a whole batch when one
// ID is already stored; its intents then go one by one, the stored ones
// come back as duplicates, and every intent is in the stream once.
func TestAtomicBatchWithStoredIDs(t *testing.T) {
	t.Parallel()
	js := batchEnv(t, true)
	intents := load(1000, "as")
	publishAll(t, context.Background(), js, jsinbox.PublisherConfig{}, intents[200:300])
	st := publishAll(t, context.Background(), js, jsinbox.PublisherConfig{Batch: 250}, intents)
	if st.BatchFallbacks == 0 || st.Duplicates != 100 || st.Published != 1000 {
		t.Fatalf("stats %+v, want a refused batch, 100 duplicates, 1000 published", st)
	}
	if msgs, ids := streamIDs(t, js); msgs != 1000 || ids != 1000 {
		t.Fatalf("stream holds %d messages with %d IDs, want 1000", msgs, ids)
	}
}

// TestAtomicBatchesNotAllowed: on a stream without atomic publishing the
// first batch is refused, the publisher stops batching, and nothing is
// lost.
func TestAtomicBatchesNotAllowed(t *testing.T) {
	t.Parallel()
	js := batchEnv(t, false)
	intents := load(1200, "an")
	st := publishAll(t, context.Background(), js, jsinbox.PublisherConfig{Batch: 100}, intents)
	if st.Published != 1200 || st.Batches != 0 || st.BatchFallbacks == 0 {
		t.Fatalf("stats %+v, want 1200 published without batches", st)
	}
	if msgs, ids := streamIDs(t, js); msgs != 1200 || ids != 1200 {
		t.Fatalf("stream holds %d messages with %d IDs, want 1200", msgs, ids)
	}
}

// TestAtomicBatchPubAckLost: a batch the server stored but whose PubAck
// was lost is published again one by one; the duplicate window drops the
// copies.
func TestAtomicBatchPubAckLost(t *testing.T) {
	t.Parallel()
	js := batchEnv(t, true)
	fp := failpoint.New()
	fp.Enable(failpoint.LosePubAck, 1)
	intents := load(600, "al")
	st := publishAll(t, context.Background(), js, jsinbox.PublisherConfig{Batch: 300, Linger: 50 * time.Millisecond}, intents, fp)
	if fp.Hits(failpoint.LosePubAck) != 1 || st.BatchFallbacks != 1 || st.Duplicates == 0 || st.Published != 600 {
		t.Fatalf("stats %+v after one lost batch PubAck, want one fallback whose copies are duplicates", st)
	}
	if msgs, ids := streamIDs(t, js); msgs != 600 || ids != 600 {
		t.Fatalf("stream holds %d messages with %d IDs, want 600", msgs, ids)
	}
}
