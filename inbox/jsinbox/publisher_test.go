package jsinbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// publishOutcome publishes intents with a new Publisher and returns its
// stats and failures, sorted by ID.
func publishOutcome(t *testing.T, js jetstream.JetStream, cfg jsinbox.PublisherConfig, intents []jsinbox.Intent) (jsinbox.PublishStats, []jsinbox.Failure) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := jsinbox.NewPublisher(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, in := range intents {
		if err := p.Publish(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	f := p.Failures()
	slices.SortFunc(f, func(a, b jsinbox.Failure) int { return strings.Compare(a.ID, b.ID) })
	return p.Stats(), f
}

// streamMsgs is how many messages stream holds.
func streamMsgs(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// TestPublisherPinsItsStream: an intent on a subject another stream
// captures (the dead-letter stream's) fails at once, naming both streams,
// never retried, in single publishes and in atomic batches; its neighbours
// are published. With ExpectStream the server refuses it; without, the
// other stream's PubAck gives it away.
func TestPublisherPinsItsStream(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{0, 50} {
		for _, expect := range []bool{false, true} {
			t.Run(fmt.Sprintf("batch=%d,expect=%v", batch, expect), func(t *testing.T) {
				t.Parallel()
				js := batchEnv(t, true)
				dlq := jsinbox.StreamOptions{}.DeadLetterConfig()
				if _, err := js.CreateStream(context.Background(), dlq); err != nil {
					t.Fatal(err)
				}
				intents := load(120, fmt.Sprintf("pin%d%v", batch, expect))
				stray := []int{5, 77}
				for _, i := range stray {
					intents[i].Subject = jsinbox.DeadLetterPrefix + intents[i].Subject
				}
				st, f := publishOutcome(t, js, jsinbox.PublisherConfig{Batch: batch, Linger: 20 * time.Millisecond, ExpectStream: expect}, intents)
				if len(f) != 2 {
					t.Fatalf("failures %+v, want the 2 intents on dead-letter subjects", f)
				}
				attempts := 1
				if batch > 0 {
					attempts = 2 // the refused batch, then on its own
				}
				for _, x := range f {
					msg := x.Err.Error()
					if !errors.Is(x.Err, jsinbox.ErrWrongStream) || x.Attempts != attempts || !strings.Contains(msg, `stream "`+dlq.Name+`", not "`+jsinbox.DefaultStream+`"`) {
						t.Errorf("failure %+v: want ErrWrongStream after %d attempts, naming %s and %s", x, attempts, dlq.Name, jsinbox.DefaultStream)
					}
				}
				if st.Published != 118 || st.Failed != 2 || st.Retries != 0 {
					t.Fatalf("stats %+v, want 118 published, 2 failed, no retries", st)
				}
				want := uint64(len(stray)) // stray copies, reported
				if expect {
					want = 0
				}
				if n := streamMsgs(t, js, dlq.Name); n != want {
					t.Fatalf("%s holds %d intents, want %d", dlq.Name, n, want)
				}
				if n := streamMsgs(t, js, jsinbox.DefaultStream); n != 118 {
					t.Fatalf("%s holds %d intents, want 118", jsinbox.DefaultStream, n)
				}
			})
		}
	}
}

// TestPublisherStreamOption: the expected stream is the configured one.
func TestPublisherStreamOption(t *testing.T) {
	t.Parallel()
	js := batchEnv(t, true)
	intents := load(3, "opt")
	st, f := publishOutcome(t, js, jsinbox.PublisherConfig{Stream: "ELSEWHERE"}, intents)
	if len(f) != 3 || st.Published != 0 || !errors.Is(f[0].Err, jsinbox.ErrWrongStream) || !strings.Contains(f[0].Err.Error(), `stream "INTENTS", not "ELSEWHERE"`) {
		t.Fatalf("stats %+v, failures %+v; want every intent failed: stored in INTENTS, not ELSEWHERE", st, f)
	}
	if st, f := publishOutcome(t, js, jsinbox.PublisherConfig{Stream: jsinbox.DefaultStream}, intents); len(f) > 0 || st.Published != 3 {
		t.Fatalf("stats %+v, failures %+v", st, f)
	}
}
