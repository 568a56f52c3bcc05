package jsinboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/jitter"
)

// publishOutcome publishes intents with a new Publisher and returns its
// stats and failures, sorted by ID.
func publishOutcome(t *testing.T, js jetstream.JetStream, cfg jsinbox.PublisherConfig, intents []inbox.Intent) (jsinbox.PublisherStats, []jsinbox.Failure) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := jsinbox.NewPublisher(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, in := range intents {
		if err := p.PublishAsync(ctx, in); err != nil {
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

// TestDuplicatePubAckNamesOriginal: what the conflict check rests on. A
// publish whose ID the stream holds gets a PubAck with duplicate=true and
// the sequence of the message stored first, not a new one.
func TestDuplicatePubAckNamesOriginal(t *testing.T) {
	t.Parallel()
	js := batchEnv(t, true)
	ctx := context.Background()
	first, err := js.Publish(ctx, "intents.1", []byte("one"), jetstream.WithMsgID("dup-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "intents.1", []byte("two"), jetstream.WithMsgID("dup-2")); err != nil {
		t.Fatal(err)
	}
	again, err := js.Publish(ctx, "intents.1", []byte("other"), jetstream.WithMsgID("dup-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate || again.Sequence != first.Sequence || again.Stream != jsinbox.DefaultStream {
		t.Fatalf("PubAck of a reused ID: %+v; want duplicate of sequence %d in %s", again, first.Sequence, jsinbox.DefaultStream)
	}
}

// reuse returns copies of intents whose payload is changed for the IDs in
// changed.
func reuse(intents []inbox.Intent, changed ...int) []inbox.Intent {
	out := slices.Clone(intents)
	for i := range out {
		if slices.Contains(changed, i) {
			out[i].Payload = fmt.Appendf(nil, `{"account":1,"amount":%d}`, 900_000+i)
		}
	}
	return out
}

// wantConflicts checks that exactly the intents at indexes idx of intents
// failed as conflicts.
func wantConflicts(t *testing.T, failures []jsinbox.Failure, intents []inbox.Intent, idx ...int) {
	t.Helper()
	var want []string
	for _, i := range idx {
		want = append(want, intents[i].ID)
	}
	slices.Sort(want)
	var got []string
	for _, f := range failures {
		got = append(got, f.ID)
		i := slices.IndexFunc(intents, func(in inbox.Intent) bool { return in.ID == f.ID })
		if !errors.Is(f.Err, inbox.ErrConflict) || i < 0 {
			t.Errorf("failure %+v: want an inbox.ErrConflict", f)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("failed intents %v, want conflicts %v", got, want)
	}
}

// TestReusedIDWithDifferentPayloadIsConflict: an ID published again inside
// the duplicate window with another payload is a conflict, reported for
// that intent; the same payload is a duplicate and a success.
func TestReusedIDWithDifferentPayloadIsConflict(t *testing.T) {
	t.Parallel()
	js := batchEnv(t, true)
	intents := load(50, "cf")
	if st, f := publishOutcome(t, js, jsinbox.PublisherConfig{}, intents); len(f) > 0 || st.Published != 50 {
		t.Fatalf("first publish: %+v, failures %v", st, f)
	}
	again := reuse(intents, 7, 31)
	st, f := publishOutcome(t, js, jsinbox.PublisherConfig{}, again)
	wantConflicts(t, f, again, 7, 31)
	if st.Conflicts != 2 || st.Failed != 2 || st.Duplicates != 48 || st.Published != 48 {
		t.Fatalf("stats %+v, want 2 conflicts (failed), 48 duplicates published", st)
	}
	if !strings.Contains(f[0].Err.Error(), "sequence ") {
		t.Errorf("conflict error does not name the stored message: %v", f[0].Err)
	}
	if n := streamMsgs(t, js, jsinbox.DefaultStream); n != 50 {
		t.Fatalf("stream holds %d messages, want 50", n)
	}
}

// TestReusedIDOnAnotherSubjectIsConflict: an intent's identity is its ID,
// subject and payload. The same ID and payload on another subject is
// deduplicated by the stream's window (by ID alone) yet nothing is stored on
// its subject: the publisher must report a conflict, not a success, one by
// one and in batches.
func TestReusedIDOnAnotherSubjectIsConflict(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 100} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			js := batchEnv(t, true)
			intents := load(50, "cs")
			cfg := jsinbox.PublisherConfig{Batch: batch, Linger: 20 * time.Millisecond}
			if st, f := publishOutcome(t, js, cfg, intents); len(f) > 0 || st.Published != 50 {
				t.Fatalf("first publish: %+v, failures %v", st, f)
			}
			again := reuse(intents)
			again[9].Subject += ".elsewhere"
			st, f := publishOutcome(t, js, cfg, again)
			wantConflicts(t, f, again, 9)
			if st.Conflicts != 1 || st.Duplicates != 49 || st.Published != 49 {
				t.Fatalf("stats %+v, want 1 conflict, 49 duplicates published", st)
			}
			if !strings.Contains(f[0].Err.Error(), "subject") {
				t.Errorf("conflict error does not name the subjects: %v", f[0].Err)
			}
		})
	}
}

// TestReusedIDWithDifferentPayloadInBatch: a batch holding an ID the stream
// already has, with another payload, is refused as a whole; published one
// by one, that intent is a conflict and the others are stored. Two intents
// sharing a new ID inside one batch end the same way: the first is stored,
// the second is a conflict.
func TestReusedIDWithDifferentPayloadInBatch(t *testing.T) {
	t.Parallel()
	js := batchEnv(t, true)
	intents := load(300, "cb")
	if st, f := publishOutcome(t, js, jsinbox.PublisherConfig{}, intents[:100]); len(f) > 0 || st.Published != 100 {
		t.Fatalf("first publish: %+v, failures %v", st, f)
	}
	again := reuse(intents, 42)
	twin := again[250]
	twin.Payload = []byte(`{"account":2,"amount":1}`)
	again = slices.Insert(again, 251, twin) // in the same batch as its original
	st, f := publishOutcome(t, js, jsinbox.PublisherConfig{Batch: 100, Linger: 50 * time.Millisecond}, again)
	if len(f) != 2 || f[0].ID != intents[250].ID || f[0].Fingerprint != inbox.Fingerprint(twin.Payload) || !errors.Is(f[0].Err, inbox.ErrConflict) ||
		f[1].ID != intents[42].ID || !errors.Is(f[1].Err, inbox.ErrConflict) {
		t.Fatalf("failures %+v, want conflicts for %s (the twin) and %s", f, intents[250].ID, intents[42].ID)
	}
	if st.Conflicts != 2 || st.Duplicates != 99 || st.Published != 299 || st.BatchFallbacks == 0 {
		t.Fatalf("stats %+v, want refused batches, 2 conflicts, 99 duplicates, 299 published", st)
	}
	if n := streamMsgs(t, js, jsinbox.DefaultStream); n != 300 {
		t.Fatalf("stream holds %d messages, want 300", n)
	}
}

// TestDuplicateThatCannotBeReadBackFails: a producer that may not read the
// stream cannot tell a duplicate from a conflict; the intent fails within
// its retry budget rather than pass unchecked.
func TestDuplicateThatCannotBeReadBackFails(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{Configure: func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "producer", Password: "producer", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"intents.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.INTENTS"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
		}
	}})
	connect := func(user string) jetstream.JetStream {
		nc, err := nats.Connect(srv.URL(), nats.UserInfo(user, user), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	admin, producer := connect("admin"), connect("producer")
	if _, err := admin.CreateStream(context.Background(), jsinbox.StreamConfig{}.Config()); err != nil {
		t.Fatal(err)
	}
	intents := load(3, "nr")
	cfg := jsinbox.PublisherConfig{Batch: 1, AckTimeout: 200 * time.Millisecond,
		Retry: jitter.Policy{Kind: jitter.Full, Base: time.Millisecond, Cap: 10 * time.Millisecond, MaxAttempts: 2}}
	if st, f := publishOutcome(t, producer, cfg, intents); len(f) > 0 || st.Published != 3 {
		t.Fatalf("first publish: %+v, failures %v", st, f)
	}
	st, f := publishOutcome(t, producer, cfg, intents[:1])
	if len(f) != 1 || f[0].Attempts != 3 || !strings.Contains(f[0].Err.Error(), "reading back") || st.Published != 0 || st.Duplicates != 0 {
		t.Fatalf("stats %+v, failures %+v; want one failure after 3 attempts to read the duplicate back", st, f)
	}
}

// TestPublisherPinsItsStream: an intent on a subject another stream
// captures (the dead-letter stream's) fails at once, naming both streams,
// never retried, in single publishes and in atomic batches; its neighbours
// are published. With the Nats-Expected-Stream header (the default) the
// server refuses it; without, the other stream's PubAck gives it away.
func TestPublisherPinsItsStream(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 50} {
		for _, expect := range []bool{false, true} {
			t.Run(fmt.Sprintf("batch=%d,expect=%v", batch, expect), func(t *testing.T) {
				t.Parallel()
				js := batchEnv(t, true)
				dlq := jsinbox.StreamConfig{}.DeadLetterConfig()
				if _, err := js.CreateStream(context.Background(), dlq); err != nil {
					t.Fatal(err)
				}
				intents := load(120, fmt.Sprintf("pin%d%v", batch, expect))
				stray := []int{5, 77}
				for _, i := range stray {
					intents[i].Subject = jsinbox.DeadLetterPrefix + intents[i].Subject
				}
				st, f := publishOutcome(t, js, jsinbox.PublisherConfig{Batch: batch, Linger: 20 * time.Millisecond, SkipExpectedStreamHeader: !expect}, intents)
				if len(f) != 2 {
					t.Fatalf("failures %+v, want the 2 intents on dead-letter subjects", f)
				}
				attempts := 1
				if batch > 1 {
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

// TestPublisherRefusesWhatEveryInboxRejects: an intent without an ID or
// subject, or with one longer than the inbox takes, is refused with
// ErrBadIntent before anything is sent.
func TestPublisherRefusesWhatEveryInboxRejects(t *testing.T) {
	t.Parallel()
	js := batchEnv(t, true)
	p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, in := range []inbox.Intent{
		{Subject: "intents.a", Payload: []byte("{}")},
		{ID: "x", Payload: []byte("{}")},
		{ID: strings.Repeat("i", 201), Subject: "intents.a"},
		{ID: "long", Subject: "intents." + strings.Repeat("s", 300)},
	} {
		if err := p.PublishAsync(context.Background(), in); !errors.Is(err, inbox.ErrBadIntent) {
			t.Errorf("Publish(ID %.10q, subject %.20q): %v, want ErrBadIntent", in.ID, in.Subject, err)
		}
	}
	if n := streamMsgs(t, js, jsinbox.DefaultStream); n != 0 {
		t.Fatalf("the stream holds %d messages", n)
	}
}

// TestPublisherRefusesWhatTheOutboxRefuses: a subject no relay could
// publish to (a wildcard, an empty token, a space) is refused by the
// publisher too, with the same ErrBadIntent, before anything is sent: one
// validator for every way an intent is published.
func TestPublisherRefusesWhatTheOutboxRefuses(t *testing.T) {
	t.Parallel()
	js := batchEnv(t, true)
	p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, subject := range []string{"intents.*", "intents.>", "intents..a", "intents.a.", ".intents.a", "intents.a b", "intents.a\tb"} {
		in := inbox.Intent{ID: "x", Subject: subject, Payload: []byte("{}")}
		if err := p.PublishAsync(context.Background(), in); !errors.Is(err, inbox.ErrBadIntent) {
			t.Errorf("Publish(subject %q): %v, want ErrBadIntent", subject, err)
		}
		if err := in.Validate(); !errors.Is(err, inbox.ErrBadIntent) {
			t.Errorf("Validate(subject %q): %v, want ErrBadIntent", subject, err)
		}
	}
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := streamMsgs(t, js, jsinbox.DefaultStream); n != 0 {
		t.Fatalf("the stream holds %d messages", n)
	}
}

// TestPublishWithoutStreamFailsAtOnce: publishing before the stream exists
// fails within a second or two with a SetupError that names EnsureStream,
// instead of spending the retry budget on "no response from stream"; both
// ways of publishing, with and without group commit.
func TestPublishWithoutStreamFailsAtOnce(t *testing.T) {
	t.Parallel()
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
	for _, batch := range []int{1, jsinbox.DefaultBatch} {
		p, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		_, err = p.Publish(ctx, inbox.Intent{ID: "no-stream-1", Subject: "intents.x", Payload: []byte("{}")})
		took := time.Since(start)
		cancel()
		p.Close()
		var setup *jsinbox.SetupError
		if !errors.As(err, &setup) || !strings.Contains(err.Error(), "jsinbox.EnsureStream") || took > 5*time.Second {
			t.Fatalf("batch %d: Publish without a stream: %v after %v, want a SetupError naming jsinbox.EnsureStream at once", batch, err, took)
		}
	}
}
