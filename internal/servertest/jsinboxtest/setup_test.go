package jsinboxtest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
)

// lostReplies is JetStream on which the first request for a durable and the
// first for a stream are sent and their replies never come back, as happens
// to a request caught in a stream or consumer leader election: each call
// returns only when its context ends, with the context's error, as nats.go
// does.
type lostReplies struct {
	jetstream.JetStream
	mu   sync.Mutex
	seen map[string]bool
	lost atomic.Int32
}

func (j *lostReplies) lose(ctx context.Context, kind string) error {
	j.mu.Lock()
	first := !j.seen[kind]
	j.seen[kind] = true
	j.mu.Unlock()
	if !first {
		return nil
	}
	j.lost.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

func (j *lostReplies) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	if err := j.lose(ctx, "durable"); err != nil {
		return nil, err
	}
	return j.JetStream.Consumer(ctx, stream, name)
}

func (j *lostReplies) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if err := j.lose(ctx, "stream"); err != nil {
		return nil, err
	}
	return j.JetStream.Stream(ctx, name)
}

// TestSetUpOutlivesLostReplies: Run's context has a deadline an hour away,
// as a job's might. The replies to the consumer's first requests for its
// durable and for a stream are lost. The consumer must not wait for them
// until that deadline: each request has its own bound, and a set-up step
// that got no answer is tried again, so every intent is applied within
// seconds. (Seen in a three-node cluster: a consumer restarted while the
// stream leader was being elected waited the whole run for a durable's
// info.)
func TestSetUpOutlivesLostReplies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	const n = 50
	e.publish(t, load(n, "lost"))
	proc, err := inbox.NewProcessor(pginbox.New(e.pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	js := &lostReplies{JetStream: e.js, seen: map[string]bool{}}
	c, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithTimeout(context.Background(), time.Hour)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("consumer did not stop within 30s")
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for c.Stats().Applied < n {
		select {
		case err := <-done:
			t.Fatalf("Run ended before applying anything: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d intents applied after 2 minutes: the consumer waits on a lost reply (%d replies lost)", c.Stats().Applied, n, js.lost.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := js.lost.Load(); got != 2 {
		t.Fatalf("%d replies lost, want 2 (the durable's and a stream's): the test did not exercise the set-up", got)
	}
	e.settle(t, time.Minute)
	e.assertClean(t, n)
}

// TestEnsureStreamOutlivesALostReply: EnsureStream's caller has a deadline
// minutes away (a set-up loop that retries until it). A lost reply to its
// first stream request must come back as an error within the request's own
// bound, for the caller to try again, not hold it until that deadline.
// (Seen: bench -cluster's set-up waited its whole 3 minutes on one.)
func TestEnsureStreamOutlivesALostReply(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	js := &lostReplies{JetStream: e.js, seen: map[string]bool{}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for {
			_, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{})
			if err == nil || ctx.Err() != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		cancel()
		t.Fatal("EnsureStream still waiting after 2 minutes with one lost reply: it waits on its caller's deadline")
	}
	if js.lost.Load() != 1 {
		t.Fatalf("%d replies lost, want 1", js.lost.Load())
	}
}
