package pgoutboxtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// TestRelayAtomicBatchMarksEachRowByItsOwnOutcome: a round of 100 rows in
// one atomic batch that the stream cannot store as a whole (one row's
// subject belongs to another stream, one has no stream, one reuses an ID
// the stream holds with another payload, one the stream holds already
// with the same payload) marks sent only the rows the stream acknowledged:
// the 96 new ones and the duplicate; the conflict and the other stream's
// row are marked failed, the row nothing acknowledged stays pending. A
// round of rows that all fit is stored as one batch.
func TestRelayAtomicBatchMarksEachRowByItsOwnOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	if _, err := jsinbox.EnsureStream(ctx, e.js, jsinbox.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	// Already in the stream: dup-1 with the payload its row has,
	// conflict-1 with another.
	for _, m := range []struct{ id, payload string }{{"dup-1", `{"n":"dup"}`}, {"conflict-1", `{"n":"first"}`}} {
		msg := &nats.Msg{Subject: "notifications.x", Data: []byte(m.payload), Header: nats.Header{jetstream.MsgIDHeader: []string{m.id}}}
		if _, err := e.js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	ins := []inbox.Intent{
		{ID: "dup-1", Subject: "notifications.x", Payload: []byte(`{"n":"dup"}`)},
		{ID: "conflict-1", Subject: "notifications.x", Payload: []byte(`{"n":"second"}`)},
		{ID: "wrong-1", Subject: "other.x", Payload: []byte(`{}`)},
		{ID: "late-1", Subject: "later.x", Payload: []byte(`{}`)},
	}
	for i := range 96 {
		ins = append(ins, inbox.Intent{ID: fmt.Sprintf("ok-%d", i), Subject: "notifications.x", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	if err := pgoutbox.Add(ctx, e.pool, ins...); err != nil {
		t.Fatal(err)
	}
	r := quickRelay(t, e, outbox.RelayConfig{Batch: 1000, Publisher: jsinbox.PublisherConfig{AckTimeout: 5 * time.Second,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond, MaxAttempts: 4}}})
	n, err := r.Round(ctx)
	if n != 100 || err == nil || !strings.Contains(err.Error(), "1 of 100 rows not acknowledged") {
		t.Fatalf("round: %d, %v; want 100 rows, 1 not acknowledged", n, err)
	}
	if s := r.Stats(); s.Sent != 97 || s.Duplicates != 1 || s.Failed != 2 || s.Retried != 1 || s.Fallbacks != 1 {
		t.Fatalf("stats %+v, want 97 sent (1 duplicate), 2 failed, 1 retried, 1 batch refused as a whole", s)
	}
	state := map[string]string{}
	rows, err := e.pool.Query(ctx, `SELECT id, CASE WHEN sent_at IS NOT NULL THEN 'sent' WHEN failed IS NOT NULL THEN 'failed' ELSE 'pending' END FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
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
	for _, in := range ins {
		want := "sent"
		switch in.ID {
		case "conflict-1", "wrong-1":
			want = "failed"
		case "late-1":
			want = "pending"
		}
		if state[in.ID] != want {
			t.Errorf("row %s is %s, want %s", in.ID, state[in.ID], want)
		}
	}
	got := e.copies(t)
	if got["conflict-1"] != 1 || got["dup-1"] != 1 || got["ok-0"] != 1 || got["ok-95"] != 1 || len(got) != 98 {
		t.Fatalf("stream holds %d IDs (%v...), want the 96 new rows once, dup-1 and conflict-1 once", len(got), got["ok-0"])
	}

	// Rows that all fit: one atomic batch, every row sent.
	for i := range 100 {
		if err := pgoutbox.Add(ctx, e.pool, inbox.Intent{ID: fmt.Sprintf("b-%d", i), Subject: "notifications.y", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(ctx, `UPDATE outbox SET failed = 'parked by the test' WHERE id = 'late-1'`); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Round(ctx); n != 100 || err != nil {
		t.Fatalf("second round: %d, %v", n, err)
	}
	if s := r.Stats(); s.Sent != 197 || s.Batches != 1 || s.Fallbacks != 1 {
		t.Fatalf("stats %+v after a round of 100 rows that fit: want 197 sent and 1 atomic batch stored", s)
	}
}

// TestRelayDrainOverlapsAndSurvivesACrash: while rows keep coming, a
// round's marks overlap the next round's take and publish. A relay that
// dies marking its third round of 100 has sent 200 rows and left 300
// pending; the stream holds 300 rows, up to 400 if the fourth round took
// and published its rows while the third was marking. The next relay sends
// every pending row again with its ID; the stream holds each row once, and
// the rows it already held come back as duplicates.
func TestRelayDrainOverlapsAndSurvivesACrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.add(t, "d", 500)
	fp := failpoint.New()
	fp.EnableEvery(failpoint.RelayBeforeMark, 3, 1)
	first := quickRelay(t, e, outbox.RelayConfig{Batch: 100})
	fp.Attach(first)
	if err := first.Run(context.Background()); !failpoint.IsCrash(err) {
		t.Fatalf("first relay: %v, want a crash marking its third round", err)
	}
	stored := len(e.copies(t))
	// The fourth round may be anywhere in its publish when the third's
	// mark crashes (a batch stored whole, or rows gone one by one after a
	// slow PubAck): the stream holds 300 to 400 rows.
	if n := e.pending(t); n != 300 || stored < 300 || stored > 400 || first.Stats().Sent != 200 {
		t.Fatalf("after the crash: %d rows pending, %d in the stream, %d sent; want 300, 300 to 400, and 200", n, stored, first.Stats().Sent)
	}
	second := quickRelay(t, e, outbox.RelayConfig{Batch: 100})
	if n, err := second.Drain(context.Background()); n != 0 || err != nil {
		t.Fatalf("drain: %d, %v", n, err)
	}
	got := e.copies(t)
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("%s: %d copies in the stream", id, got[id])
		}
	}
	if s := second.Stats(); s.Sent != 300 || s.Duplicates != int64(stored-200) || e.pending(t) != 0 {
		t.Fatalf("second relay: %+v, %d pending; want 300 sent, %d of them duplicates, none pending", s, e.pending(t), stored-200)
	}
}
