package jsinboxtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/jitter"
)

// TestPublisherAcrossLeaderElections publishes into an R3 stream on three
// nodes while the stream leader is killed, leadership is handed over, and
// the node the producer is connected to dies (it reconnects to another).
// Publishes meet PubAck timeouts, "no responders" while no leader is
// elected, and disconnects; each is retried with the same ID. In the end
// every intent is acknowledged and stored exactly once, one by one and in
// atomic batches.
func TestPublisherAcrossLeaderElections(t *testing.T) {
	for _, batch := range []int{0, 50} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			publishThroughElections(t, batch)
		})
	}
}

func publishThroughElections(t *testing.T, batch int) {
	const n = 1200
	cl := natsenv.NewCluster(t, natsenv.ClusterOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nc, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cfg := jsinbox.StreamConfig{Replicas: 3}.WithDefaults()
	if _, err := natsenv.CreateStream(ctx, js, cfg.Config()); err != nil {
		t.Fatal(err)
	}
	p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{Batch: batch, AckTimeout: time.Second, MaxInFlight: 128,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 20 * time.Millisecond, Cap: 500 * time.Millisecond, MaxElapsed: 90 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	intents := make([]inbox.Intent, n)
	for i := range intents {
		intents[i] = inbox.Intent{ID: fmt.Sprintf("e-%d-%d", batch, i), Subject: "intents.x", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	at := make(chan int, 4)
	pubErr := make(chan error, 1)
	go func() {
		for i, in := range intents {
			if i > 0 && i%(n/4) == 0 {
				at <- i
			}
			if err := p.PublishAsync(ctx, in); err != nil {
				pubErr <- err
				return
			}
			time.Sleep(time.Millisecond)
		}
		pubErr <- p.Flush(ctx)
	}()
	whole := func() {
		t.Helper()
		if err := cl.WaitHealthy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A quarter in: the stream leader is killed.
	<-at
	l, err := cl.WaitStreamLeader(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	cl.Kill(l)
	if _, err := cl.WaitStreamLeader(ctx, jsinbox.DefaultStream); err != nil {
		t.Fatal(err)
	}
	if err := cl.Start(l); err != nil {
		t.Fatal(err)
	}
	whole()
	// Half-way: the leader hands over on request.
	<-at
	if err := natsenv.StepDownStream(ctx, nc, jsinbox.DefaultStream); err != nil {
		t.Fatal(err)
	}
	// Three quarters: the producer's own server is killed.
	<-at
	mine := cl.Node(nc.ConnectedServerName())
	if mine < 0 {
		t.Fatalf("producer connected to %q, no node of the cluster", nc.ConnectedServerName())
	}
	cl.Kill(mine)
	if _, err := cl.WaitStreamLeader(ctx, jsinbox.DefaultStream); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := cl.Start(mine); err != nil {
		t.Fatal(err)
	}
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	whole()

	st := p.Stats()
	t.Logf("batch=%d: %+v", batch, st)
	if f := p.Failures(); len(f) > 0 {
		t.Fatalf("%d intents not acknowledged, first %s after %d attempts: %v", len(f), f[0].ID, f[0].Attempts, f[0].Err)
	}
	if st.Retries+st.BatchFallbacks == 0 {
		t.Error("no publish was retried: the faults did not meet a publish")
	}
	// Every acknowledged intent is stored once.
	stored, total := storedIDs(t, ctx, js)
	for _, in := range intents {
		if c := stored[in.ID]; c != 1 {
			t.Errorf("intent %s stored %d times", in.ID, c)
		}
	}
	if total != n {
		t.Errorf("stream holds %d messages for %d intents", total, n)
	}
}

// storedIDs reads the intents stream and counts its messages per ID. Right
// after the faults a read may meet a node still settling ("no responders"):
// it starts over until a whole read succeeds.
func storedIDs(t *testing.T, ctx context.Context, js jetstream.JetStream) (map[string]int, uint64) {
	t.Helper()
	var last error
	for range 10 {
		stored, total, err := readIDs(ctx, js)
		if err == nil {
			return stored, total
		}
		last = err
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("read the stream: %v", last)
	return nil, 0
}

func readIDs(ctx context.Context, js jetstream.JetStream) (map[string]int, uint64, error) {
	s, err := js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		return nil, 0, err
	}
	st := s.CachedInfo().State
	stored := map[string]int{}
	for seq := st.FirstSeq; seq <= st.LastSeq && st.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return nil, 0, fmt.Errorf("message %d: %w", seq, err)
		}
		stored[m.Header.Get(jetstream.MsgIDHeader)]++
	}
	return stored, st.Msgs, nil
}
