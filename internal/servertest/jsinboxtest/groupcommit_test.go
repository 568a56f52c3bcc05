package jsinboxtest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/jitter"
)

// groupEnv is an embedded server, a connection that reconnects at once and
// the intents stream (atomic publishing allowed or not).
func groupEnv(t *testing.T, opts natsenv.NATSOptions, atomicAllowed bool) (*natsenv.NATS, jetstream.JetStream) {
	t.Helper()
	srv := natsenv.NewNATS(t, opts)
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(50*time.Millisecond, 0),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
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
	return srv, js
}

// outcome is what Publish returned for one intent.
type outcome struct {
	in  inbox.Intent
	ack *jetstream.PubAck
	err error
}

// callers publishes intents with Publish from n goroutines, each taking
// the next intent once its previous one is settled, and returns every
// outcome by intent index.
func callers(t *testing.T, p *jsinbox.Publisher, n int, intents []inbox.Intent) []outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := make([]outcome, len(intents))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(intents) {
					return
				}
				ack, err := p.Publish(ctx, intents[i])
				out[i] = outcome{in: intents[i], ack: ack, err: err}
			}
		})
	}
	wg.Wait()
	return out
}

// storedAt returns the ID and payload of the message at seq.
func storedAt(t *testing.T, js jetstream.JetStream, seq uint64) (string, string) {
	t.Helper()
	s, err := js.Stream(context.Background(), jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatalf("message %d: %v", seq, err)
	}
	return m.Header.Get(jetstream.MsgIDHeader), string(m.Data)
}

// wantOwnAcks checks that every outcome is a PubAck of the intents stream
// naming the sequence that holds that very intent, duplicates as said, and
// that no two new intents share a sequence.
func wantOwnAcks(t *testing.T, js jetstream.JetStream, outs []outcome, duplicate func(i int) bool) {
	t.Helper()
	seqs := map[uint64]string{}
	for i, o := range outs {
		if o.err != nil || o.ack == nil {
			t.Fatalf("intent %s: error %v", o.in.ID, o.err)
		}
		if o.ack.Stream != jsinbox.DefaultStream || o.ack.Duplicate != duplicate(i) {
			t.Fatalf("intent %s: PubAck %+v, want stream %s, duplicate %v", o.in.ID, o.ack, jsinbox.DefaultStream, duplicate(i))
		}
		if other, ok := seqs[o.ack.Sequence]; ok {
			t.Fatalf("intents %s and %s both acknowledged at sequence %d", other, o.in.ID, o.ack.Sequence)
		}
		seqs[o.ack.Sequence] = o.in.ID
		if id, data := storedAt(t, js, o.ack.Sequence); id != o.in.ID || data != string(o.in.Payload) {
			t.Fatalf("intent %s acknowledged at sequence %d, which holds %s %s", o.in.ID, o.ack.Sequence, id, data)
		}
	}
}

// TestGroupCommitCallers: intents published one at a time by many
// goroutines share atomic batches, and each caller gets the PubAck of its
// own intent: the sequence that holds it.
func TestGroupCommitCallers(t *testing.T) {
	t.Parallel()
	_, js := groupEnv(t, natsenv.NATSOptions{SyncAlways: true}, true)
	p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	intents := load(3000, "gc")
	outs := callers(t, p, 64, intents)
	wantOwnAcks(t, js, outs, func(int) bool { return false })
	st := p.Stats()
	if st.Published != 3000 || st.Failed != 0 || st.BatchFallbacks != 0 || st.Batches == 0 || st.Published/st.Batches < 4 {
		t.Fatalf("stats %+v, want 3000 published in batches of 4+ on average, no fallback", st)
	}
	if msgs, ids := streamIDs(t, js); msgs != 3000 || ids != 3000 {
		t.Fatalf("stream holds %d messages with %d IDs, want 3000", msgs, ids)
	}
	t.Logf("%d intents in %d batches", st.Published, st.Batches)
}

// TestGroupCommitStoredIDs: a batch holding IDs the stream already has is
// refused as a whole and published again one intent at a time: each
// stored one is acknowledged as a duplicate of its first copy, every other
// intent is stored once, and each caller gets its own intent's PubAck.
func TestGroupCommitStoredIDs(t *testing.T) {
	t.Parallel()
	_, js := groupEnv(t, natsenv.NATSOptions{}, true)
	intents := load(2000, "gs")
	stored := func(i int) bool { return i%10 == 3 }
	var first []inbox.Intent
	for i, in := range intents {
		if stored(i) {
			first = append(first, in)
		}
	}
	publishAll(t, context.Background(), js, jsinbox.PublisherConfig{Batch: 1}, first)
	p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	outs := callers(t, p, 64, intents)
	wantOwnAcks(t, js, outs, stored)
	st := p.Stats()
	if st.Published != 2000 || st.Duplicates != 200 || st.BatchFallbacks == 0 || st.Failed != 0 {
		t.Fatalf("stats %+v, want 2000 published, 200 duplicates, refused batches", st)
	}
	if msgs, ids := streamIDs(t, js); msgs != 2000 || ids != 2000 {
		t.Fatalf("stream holds %d messages with %d IDs, want 2000", msgs, ids)
	}
}

// TestGroupCommitConflict: an ID the stream holds, reused with another
// payload, fails with inbox.ErrConflict for the caller that published it, and
// only for that one.
func TestGroupCommitConflict(t *testing.T) {
	t.Parallel()
	_, js := groupEnv(t, natsenv.NATSOptions{}, true)
	intents := load(1000, "gx")
	publishAll(t, context.Background(), js, jsinbox.PublisherConfig{Batch: 1}, intents[:100])
	again := reuse(intents, 17, 640) // 17 is stored: a conflict; 640 is new
	p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	outs := callers(t, p, 64, again)
	for i, o := range outs {
		if i == 17 {
			if !errors.Is(o.err, inbox.ErrConflict) || o.ack != nil || !strings.Contains(o.err.Error(), o.in.ID) {
				t.Fatalf("intent %s (reused ID): %v, %+v; want inbox.ErrConflict naming it", o.in.ID, o.err, o.ack)
			}
			continue
		}
		if o.err != nil || o.ack == nil || o.ack.Duplicate != (i < 100) {
			t.Fatalf("intent %d %s: %v, %+v", i, o.in.ID, o.err, o.ack)
		}
	}
	st := p.Stats()
	if st.Conflicts != 1 || st.Failed != 1 || st.Published != 999 || len(p.Failures()) != 0 {
		t.Fatalf("stats %+v, failures %v; want 1 conflict, 999 published, none listed", st, p.Failures())
	}
	if id, data := storedAt(t, js, 18); id != intents[17].ID || data != string(intents[17].Payload) {
		t.Fatalf("sequence 18 holds %s %s, want the first payload of %s", id, data, intents[17].ID)
	}
	if msgs, ids := streamIDs(t, js); msgs != 1000 || ids != 1000 {
		t.Fatalf("stream holds %d messages with %d IDs, want 1000", msgs, ids)
	}
}

// TestGroupCommitServerRestart: the server restarts twice while 64 callers
// publish; every intent whose caller got a PubAck is stored exactly once,
// and so is every other: the callers publish theirs again with the same ID.
func TestGroupCommitServerRestart(t *testing.T) {
	t.Parallel()
	srv, js := groupEnv(t, natsenv.NATSOptions{SyncAlways: true}, true)
	p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{AckTimeout: time.Second,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond, MaxAttempts: 50, MaxElapsed: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	intents := load(6000, "gr")
	restarted := make(chan error, 1)
	go func() {
		var err error
		for _, at := range []int64{1000, 3000} {
			for p.Stats().Published < at {
				time.Sleep(time.Millisecond)
			}
			err = errors.Join(err, srv.Restart())
		}
		restarted <- err
	}()
	outs := callers(t, p, 64, intents)
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	var again []inbox.Intent
	acked := 0
	for _, o := range outs {
		if o.err != nil {
			again = append(again, o.in)
			continue
		}
		acked++
	}
	t.Logf("%d acknowledged, %d published again; stats %+v", acked, len(again), p.Stats())
	for _, o := range callers(t, p, 64, again) {
		if o.err != nil {
			t.Fatalf("intent %s published again: %v", o.in.ID, o.err)
		}
	}
	if msgs, ids := streamIDs(t, js); msgs != len(intents) || ids != len(intents) {
		t.Fatalf("stream holds %d messages with %d IDs, want %d", msgs, ids, len(intents))
	}
	if st := p.Stats(); st.Batches == 0 {
		t.Fatalf("stats %+v: want batches", st)
	}
}

// countingHandler counts the records at Warn.
type countingHandler struct {
	mu    sync.Mutex
	warns []string
}

func (h *countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.warns = append(h.warns, r.Message)
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// TestGroupCommitWithoutAtomicStream: on a stream that does not allow
// atomic batches, the callers' intents are published one at a time after
// the first refused batch, which the log says once.
func TestGroupCommitWithoutAtomicStream(t *testing.T) {
	t.Parallel()
	_, js := groupEnv(t, natsenv.NATSOptions{}, false)
	h := &countingHandler{}
	p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	intents := load(1500, "gn")
	wantOwnAcks(t, js, callers(t, p, 64, intents), func(int) bool { return false })
	st := p.Stats()
	if st.Published != 1500 || st.Batches != 0 || st.BatchFallbacks == 0 {
		t.Fatalf("stats %+v, want 1500 published without batches", st)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.warns) != 1 || !strings.Contains(h.warns[0], "does not allow atomic batches") {
		t.Fatalf("warnings %q, want one saying the stream takes no atomic batches", h.warns)
	}
}

// TestPublishContextAndClose: a caller whose context ends gets its
// error at once; Close fails every intent still in flight with ErrClosed
// and returns every waiting caller; a publish after Close is refused. The
// package's leak check then finds no goroutine of the publisher left.
func TestPublishContextAndClose(t *testing.T) {
	t.Parallel()
	_, js := groupEnv(t, natsenv.NATSOptions{}, true)
	p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{AckTimeout: 200 * time.Millisecond,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond, MaxAttempts: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	intents := load(200, "gq")
	for i := range intents {
		// No stream captures these: every publish finds no responders
		// and is retried, for far longer than the test runs.
		intents[i].Subject = "nowhere." + intents[i].Subject
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := p.Publish(ctx, intents[0]); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("Publish with a context that ends: %v after %v, want DeadlineExceeded at once", err, time.Since(start))
	}
	errs := make(chan error, len(intents)-1)
	for _, in := range intents[1:] {
		go func() {
			_, err := p.Publish(context.Background(), in)
			errs <- err
		}()
	}
	time.Sleep(500 * time.Millisecond) // publishes and retries under way
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return")
	}
	for range len(intents) - 1 {
		select {
		case err := <-errs:
			if !errors.Is(err, jsinbox.ErrClosed) {
				t.Fatalf("caller waiting at Close: %v, want ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a caller still waits after Close")
		}
	}
	if err := p.PublishAsync(context.Background(), intents[0]); !errors.Is(err, jsinbox.ErrClosed) {
		t.Fatalf("Publish after Close: %v, want ErrClosed", err)
	}
	if _, err := p.Publish(context.Background(), intents[0]); !errors.Is(err, jsinbox.ErrClosed) {
		t.Fatalf("Publish after Close: %v, want ErrClosed", err)
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer fcancel()
	if err := p.Flush(fctx); err != nil {
		t.Fatalf("Flush after Close: %v: an intent is left unsettled", err)
	}
	if st := p.Stats(); st.Failed != int64(len(intents)) {
		t.Fatalf("stats %+v, want all %d failed", st, len(intents))
	}
}

// TestPublisherBadBatch: a negative Batch is refused with a clear error.
func TestPublisherBadBatch(t *testing.T) {
	t.Parallel()
	_, err := jsinbox.NewPublisher(nil, jsinbox.PublisherConfig{Batch: -1})
	if err == nil || !strings.Contains(err.Error(), "Batch -1") {
		t.Fatalf("NewPublisher(Batch -1) = %v, want an error naming it", err)
	}
}

// TestPublisherDefaultsToGroupCommit: group commit is on unless Batch is 1.
func TestPublisherDefaultsToGroupCommit(t *testing.T) {
	t.Parallel()
	c := jsinbox.PublisherConfig{}.WithDefaults()
	if c.Batch != jsinbox.DefaultBatch || c.MinBatch != jsinbox.DefaultMinBatch || c.Linger != 0 {
		t.Fatalf("defaults %+v, want Batch %d, MinBatch %d, no Linger", c, jsinbox.DefaultBatch, jsinbox.DefaultMinBatch)
	}
	if off := (jsinbox.PublisherConfig{Batch: 1}).WithDefaults(); off.Batch != 1 {
		t.Fatalf("Batch 1 became %d", off.Batch)
	}
}
