package pgoutboxtest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// allowFast turns on allow_batched on the env's stream: fast batches.
func allowFast(t *testing.T, e *env) {
	t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowBatchPublish = true
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// rowStates reads each outbox row's state: sent, failed or pending.
func rowStates(t *testing.T, e *env) map[string]string {
	t.Helper()
	state := map[string]string{}
	rows, err := e.pool.Query(context.Background(), `SELECT id, CASE WHEN sent_at IS NOT NULL THEN 'sent' WHEN failed IS NOT NULL THEN 'failed' ELSE 'pending' END FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			t.Fatal(err)
		}
		state[id] = st
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return state
}

// TestRelayFastBatchMarksOnlyWhatTheServerStored: a round of 100 rows as
// one fast batch in which row 41's subject has no stream (the server sees
// a gap there and ends the batch at row 40) and row 82's belongs to another
// stream. The fast batch's PubAck covers rows 1 to 40 only; the rows after
// them go again as atomic batches with their IDs: the row with no stream
// stays pending, the other stream's row is marked failed, every other row
// is sent and in the stream once. A round of rows that all fit is one fast
// batch acknowledged whole.
func TestRelayFastBatchMarksOnlyWhatTheServerStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	allowFast(t, e)
	if _, err := jsinbox.EnsureStream(ctx, e.js, jsinbox.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	var ins []inbox.Intent
	for i := range 100 {
		in := inbox.Intent{ID: fmt.Sprintf("ok-%d", i), Subject: "notifications.x", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		switch i {
		case 40:
			in = inbox.Intent{ID: "late-1", Subject: "later.x", Payload: []byte(`{}`)}
		case 81:
			in = inbox.Intent{ID: "wrong-1", Subject: "other.x", Payload: []byte(`{}`)}
		}
		ins = append(ins, in)
	}
	if err := pgoutbox.Add(ctx, e.pool, ins...); err != nil {
		t.Fatal(err)
	}
	r := quickRelay(t, e, outbox.RelayConfig{Batch: 1000, Publish: outbox.PublishFast, Publisher: jsinbox.PublisherConfig{AckTimeout: 5 * time.Second,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond, MaxAttempts: 1}}})
	n, err := r.Round(ctx)
	if n != 100 || err == nil || !strings.Contains(err.Error(), "1 of 100 rows not acknowledged") {
		t.Errorf("round: %d, %v; want 100 rows, 1 not acknowledged", n, err)
	}
	if s := r.Stats(); s.Sent != 98 || s.Failed != 1 || s.Retried != 1 || s.FastShort != 1 || s.FastBatches != 0 {
		t.Errorf("stats %+v, want 98 sent, 1 failed, 1 retried, 1 fast batch acknowledged in part", s)
	}
	state := rowStates(t, e)
	for _, in := range ins {
		want := "sent"
		switch in.ID {
		case "late-1":
			want = "pending"
		case "wrong-1":
			want = "failed"
		}
		if state[in.ID] != want {
			t.Errorf("row %s is %s, want %s", in.ID, state[in.ID], want)
		}
	}
	got := e.copies(t)
	for _, in := range ins {
		if want := map[bool]int{true: 1}[state[in.ID] == "sent"]; got[in.ID] != want {
			t.Errorf("%s: %d copies in the stream, want %d", in.ID, got[in.ID], want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Rows that all fit: one fast batch, acknowledged whole.
	for i := range 100 {
		if err := pgoutbox.Add(ctx, e.pool, inbox.Intent{ID: fmt.Sprintf("b-%d", i), Subject: "notifications.y", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(ctx, `UPDATE outbox SET failed = 'parked by the test' WHERE id = 'late-1'`); err != nil {
		t.Fatal(err)
	}
	batches := r.Stats().Batches
	if n, err := r.Round(ctx); n != 100 || err != nil {
		t.Fatalf("second round: %d, %v", n, err)
	}
	if s := r.Stats(); s.Sent != 198 || s.FastBatches != 1 || s.Batches != batches {
		t.Fatalf("stats %+v after a round of 100 rows that fit: want 198 sent, 1 fast batch acknowledged whole, no more atomic batches", s)
	}
	if got := e.copies(t); got["b-0"] != 1 || got["b-99"] != 1 || len(got) != 198 {
		t.Fatalf("stream holds %d IDs, want 198", len(got))
	}
}

// TestRelayFastBatchCrashes: a relay that dies in the middle of its fast
// batch (half its rows published, the batch never committed) or between
// the PubAck and the mark leaves all its rows pending; a lost PubAck leaves
// the rows to be published again. The next relay (or round) publishes them
// with the same IDs, in fast batches, and the stream holds each ID once.
func TestRelayFastBatchCrashes(t *testing.T) {
	t.Parallel()
	for _, pt := range []hook.Point{failpoint.RelayPubAckWait, failpoint.RelayBeforeMark, failpoint.LosePubAck} {
		t.Run(pt.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			allowFast(t, e)
			ids := e.add(t, "k", 300)
			fp := failpoint.New()
			fp.Enable(pt, 1)
			if pt == failpoint.LosePubAck {
				// A batch of 100 gets two answers, the flow
				// acknowledgement of its first row and its PubAck:
				// the first round's PubAck is lost.
				fp.EnableEvery(pt, 2, 1)
			}
			cfg := outbox.RelayConfig{Batch: 100, Publish: outbox.PublishFast, Publisher: jsinbox.PublisherConfig{AckTimeout: time.Second}}
			first := quickRelay(t, e, cfg)
			fp.Attach(first)
			if pt == failpoint.LosePubAck {
				// The round's fast batch is stored and its PubAck lost:
				// its rows go again as atomic batches, which the stream
				// takes as duplicates, each row on its own.
				drain(t, first)
				s := first.Stats()
				if fp.Hits(pt) != 1 || s.Sent != 300 || s.FastShort != 1 || s.Duplicates != 100 {
					t.Fatalf("relay %+v with %d lost PubAcks: want 300 sent, 1 fast batch acknowledged in part, its 100 rows duplicates", s, fp.Hits(pt))
				}
			} else {
				err := first.Run(context.Background())
				if !failpoint.IsCrash(err) || fp.Hits(pt) != 1 {
					t.Fatalf("first relay: %v (hits %d), want a crash at %s", err, fp.Hits(pt), pt)
				}
				if n := e.pending(t); n != 300 {
					t.Fatalf("after the crash %d rows pending, want all 300 (the crashed batch unmarked)", n)
				}
				// What the dead relay published reaches the stream: half its
				// batch, or all of it.
				want := 100
				if pt == failpoint.RelayPubAckWait {
					want = 50
				}
				deadline := time.Now().Add(2 * time.Minute)
				for len(e.copies(t)) != want {
					if time.Now().After(deadline) {
						t.Fatalf("the stream holds %d rows after the crash, want %d", len(e.copies(t)), want)
					}
					time.Sleep(50 * time.Millisecond)
				}
				second := quickRelay(t, e, cfg)
				drain(t, second)
				if s := second.Stats(); s.Sent != 300 || s.FastBatches != 3 {
					t.Fatalf("second relay %+v: want 300 sent in 3 fast batches acknowledged whole", s)
				}
			}
			got := e.copies(t)
			for _, id := range ids {
				if got[id] != 1 {
					t.Fatalf("%s: %d copies in the stream after %s", id, got[id], pt)
				}
			}
			if n := e.pending(t); n != 0 {
				t.Fatalf("%d rows still pending", n)
			}
		})
	}
}

// TestRelayFastBatchOnAStreamWithout: a stream without allow_batched
// refuses the first fast batch; the relay says so once and publishes
// atomic batches from then on, every row sent once.
func TestRelayFastBatchOnAStreamWithout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.add(t, "n", 300)
	log := testenv.NewLogTail(1000)
	r := quickRelay(t, e, outbox.RelayConfig{Batch: 100, Publish: outbox.PublishFast,
		Logger: slog.New(slog.NewTextHandler(log, nil))})
	drain(t, r)
	s := r.Stats()
	if s.Sent != 300 || s.FastBatches != 0 || s.Batches != 3 {
		t.Fatalf("stats %+v: want 300 sent in 3 atomic batches, no fast batch", s)
	}
	if got := strings.Count(log.String(), "does not allow fast batches"); got != 1 {
		t.Fatalf("the relay said %d times that the stream takes no fast batches, want once:\n%s", got, log.String())
	}
	got := e.copies(t)
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("%s: %d copies in the stream", id, got[id])
		}
	}
}
