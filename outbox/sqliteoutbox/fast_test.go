package sqliteoutbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

// TestSQLiteRelayFastBatch: with fast batches on SQLite, a relay that dies
// in the middle of its batch leaves its rows leased; once the lease runs
// out the next relay sends them again, and the stream holds each ID once.
// A row whose fast batch and atomic retries get no PubAck (no stream
// captures its subject) stays pending; the rows around it are sent.
func TestSQLiteRelayFastBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	s, err := e.js.Stream(ctx, "NOTIFICATIONS")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowBatchPublish = true
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	relay := func() *outbox.Relay {
		r, err := outbox.NewRelay(sqliteoutbox.New(e.db).WithLease(300*time.Millisecond), e.js, outbox.RelayConfig{Stream: "NOTIFICATIONS", Batch: 100,
			Publish:   outbox.PublishFast,
			Publisher: jsinbox.PublisherConfig{Retry: jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond, MaxAttempts: 2}},
			Idle:      jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond},
			Retry:     jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r
	}
	if err := e.add(t, intents("k", 300)...); err != nil {
		t.Fatal(err)
	}
	fp := failpoint.New()
	fp.Enable(failpoint.RelayPubAckWait, 1)
	first := relay()
	fp.Attach(first)
	if err := first.Run(ctx); !failpoint.IsCrash(err) {
		t.Fatalf("first relay: %v, want a crash in the middle of its fast batch", err)
	}
	second := relay()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- second.Run(rctx) }()
	for e.pending(t) > 0 && rctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := e.copies(t)
	if len(got) != 300 {
		t.Fatalf("stream holds %d IDs, want 300", len(got))
	}
	for id, n := range got {
		if n != 1 {
			t.Fatalf("%s: %d copies after a crash in the middle of a fast batch", id, n)
		}
	}
	if s := second.Stats(); s.Sent != 300 || s.FastBatches != 3 {
		t.Fatalf("second relay %+v: want 300 sent in 3 fast batches acknowledged whole", s)
	}

	ins := intents("m", 20)
	ins[10] = inbox.Intent{ID: "late-1", Subject: "later.x", Payload: []byte(`{}`)}
	if err := e.add(t, ins...); err != nil {
		t.Fatal(err)
	}
	third := relay() // Run closed the second one's publisher
	n, err := third.Round(ctx)
	if n != 20 || err == nil || !strings.Contains(err.Error(), "1 of 20 rows not acknowledged") {
		t.Fatalf("round: %d, %v; want 20 rows, 1 not acknowledged", n, err)
	}
	if e.pending(t) != 1 || len(e.copies(t)) != 319 {
		t.Fatalf("%d rows pending, %d IDs in the stream; want late-1 pending and the 19 others sent", e.pending(t), len(e.copies(t)))
	}
}
