package pgoutboxtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

func TestMain(m *testing.M) { testenv.MainNoLeaks(m) }

const stream = "NOTIFICATIONS"

type env struct {
	pool *pgxpool.Pool
	st   *pgoutbox.Store
	js   jetstream.JetStream
	srv  *natsenv.NATS
}

// newEnv starts a nats-server with the NOTIFICATIONS stream (subjects
// notifications.>) and a database with the outbox schema.
func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	e := &env{srv: natsenv.NewNATS(t, natsenv.NATSOptions{})}
	pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The outbox store as an embedder gets it: from the inbox's store.
	e.pool, e.st = pool, pginbox.New(pool).Outbox()
	n, err := e.st.Migrate(ctx)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if st, err := e.st.MigrationStatus(ctx); err != nil || n != len(st) {
		t.Fatalf("migrate applied %d of the %d migrations (%v)", n, len(st), err)
	}
	if err := e.st.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(e.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if e.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	if _, err := jsinbox.EnsureStream(ctx, e.js, jsinbox.StreamConfig{Name: stream, Subjects: []string{"notifications.>"}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// add commits intents n..m-1 in one transaction each of 50.
func (e *env) add(t *testing.T, prefix string, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := 0; i < n; i += 50 {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ins []inbox.Intent
		for j := i; j < min(n, i+50); j++ {
			id := fmt.Sprintf("%s-%d", prefix, j)
			ids = append(ids, id)
			ins = append(ins, inbox.Intent{ID: id, Subject: "notifications.x", Payload: []byte(fmt.Sprintf(`{"n":%d}`, j))})
		}
		if err := pgoutbox.Add(ctx, tx, ins...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// copies counts the stream's messages per ID.
func (e *env) copies(t *testing.T) map[string]int {
	t.Helper()
	return pipelinetest.CopiesByID(t, e.js, stream)
}

func (e *env) pending(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE sent_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func quickRelay(t *testing.T, e *env, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	cfg.Stream = stream
	if cfg.Idle.Base == 0 {
		cfg.Idle = jitter.Policy{Kind: jitter.Full, Base: 20 * time.Millisecond, Cap: 50 * time.Millisecond}
	}
	cfg.Retry = jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond}
	r, err := outbox.NewRelay(e.st, e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// drain runs rounds until one finds nothing pending.
func drain(t *testing.T, r *outbox.Relay) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		n, err := r.Round(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

func TestFollowUpIDIsStable(t *testing.T) {
	t.Parallel()
	a, err := outbox.FollowUpID("pay-7", "notify")
	if err != nil || a != "notify:pay-7" {
		t.Fatalf("FollowUpID = %q, %v", a, err)
	}
	if b, _ := outbox.FollowUpID("pay-7", "notify"); b != a {
		t.Fatalf("same input, other ID: %q and %q", a, b)
	}
	if b, _ := outbox.FollowUpID("pay-7", "ship"); b == a {
		t.Fatal("two kinds of one parent share an ID")
	}
	long := strings.Repeat("x", inbox.MaxIDLen)
	l1, err := outbox.FollowUpID(long, "notify")
	if err != nil || len(l1) > inbox.MaxIDLen || inbox.ValidateID(l1) != nil {
		t.Fatalf("long parent: %q (%d bytes), %v", l1, len(l1), err)
	}
	if l2, _ := outbox.FollowUpID(long[1:]+"y", "notify"); l2 == l1 {
		t.Fatal("two long parents share a follow-up ID")
	}
	for _, bad := range [][2]string{{"", "notify"}, {"p 1", "notify"}, {"p", ""}, {"p", "no tify"}, {"p", strings.Repeat("k", 65)}, {"p", "a:b"}} {
		if _, err := outbox.FollowUpID(bad[0], bad[1]); !errors.Is(err, inbox.ErrBadIntent) {
			t.Errorf("FollowUpID(%q, %q): %v, want ErrBadIntent", bad[0], bad[1], err)
		}
	}
}

// TestAddRepeatsAndConflicts: an intent added again with the same contents
// is one row; with another payload or subject it is an error; a rolled back
// transaction leaves nothing; bad input is refused before anything is
// written.
func TestAddRepeatsAndConflicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	in := inbox.Intent{ID: "n-1", Subject: "notifications.a", Payload: []byte(`{"a":1}`), Parent: "pay-1"}
	for range 2 {
		if err := pgoutbox.Add(ctx, e.pool, in); err != nil {
			t.Fatal(err)
		}
	}
	other := in
	other.Payload = []byte(`{"a":2}`)
	if err := pgoutbox.Add(ctx, e.pool, other); !errors.Is(err, inbox.ErrConflict) {
		t.Fatalf("same ID, other payload: %v, want inbox.ErrConflict", err)
	}
	other = in
	other.Subject = "notifications.b"
	if err := pgoutbox.Add(ctx, e.pool, other); !errors.Is(err, inbox.ErrConflict) {
		t.Fatalf("same ID, other subject: %v, want inbox.ErrConflict", err)
	}
	if err := pgoutbox.Add(ctx, e.pool, in, other); !errors.Is(err, inbox.ErrConflict) {
		t.Fatalf("one call, one ID, two payloads: %v", err)
	}
	// The transaction stays usable after a conflict.
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgoutbox.Add(ctx, tx, inbox.Intent{ID: "n-1", Subject: "notifications.a", Payload: []byte(`{}`)}); !errors.Is(err, inbox.ErrConflict) {
		t.Fatal(err)
	}
	if err := pgoutbox.Add(ctx, tx, inbox.Intent{ID: "n-2", Subject: "notifications.a"}); err != nil {
		t.Fatalf("after a conflict in the same transaction: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []inbox.Intent{{Subject: "notifications.a"}, {ID: "x", Subject: ""}, {ID: "x", Subject: "notifications.>"},
		{ID: "x", Subject: "a b"}, {ID: "x", Subject: "a..b"}, {ID: "x y", Subject: "a"}, {ID: "x", Subject: "a", Parent: "p q"}} {
		if err := pgoutbox.Add(ctx, e.pool, bad); !errors.Is(err, inbox.ErrBadIntent) {
			t.Errorf("Add(%+v): %v, want ErrBadIntent", bad, err)
		}
	}
	var n int
	var parent string
	if err := e.pool.QueryRow(ctx, `SELECT count(*), max(parent_id) FROM outbox`).Scan(&n, &parent); err != nil || n != 1 || parent != "pay-1" {
		t.Fatalf("outbox holds %d rows (parent %q), %v; want the one n-1 of pay-1", n, parent, err)
	}
}

// TestConcurrentAddsOfOneID: two transactions add the same ID at once with
// different payloads; the second waits for the first and, once it commits,
// must see a conflict, not a silent success.
func TestConcurrentAddsOfOneID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	tx1, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx) //nolint:errcheck
	if err := pgoutbox.Add(ctx, tx1, inbox.Intent{ID: "c-1", Subject: "notifications.a", Payload: []byte("one")}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		tx2, err := e.pool.Begin(ctx)
		if err != nil {
			done <- err
			return
		}
		defer tx2.Rollback(ctx) //nolint:errcheck
		done <- pgoutbox.Add(ctx, tx2, inbox.Intent{ID: "c-1", Subject: "notifications.a", Payload: []byte("two")})
	}()
	time.Sleep(200 * time.Millisecond) // the second insert waits on the first's row
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, inbox.ErrConflict) {
		t.Fatalf("the concurrent add of another payload: %v, want inbox.ErrConflict", err)
	}
}

// TestRelaySendsEachRowOnce: rows added in committed transactions are
// published once each, with their ID as Nats-Msg-Id, and marked sent; rows of
// a rolled back transaction are never published.
func TestRelaySendsEachRowOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	ids := e.add(t, "s", 1200)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgoutbox.Add(ctx, tx, inbox.Intent{ID: "rolled-back", Subject: "notifications.x"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var lags int
	var mu sync.Mutex
	r := quickRelay(t, e, outbox.RelayConfig{Batch: 500, Observer: outbox.SentFunc(func(l []time.Duration) { mu.Lock(); lags += len(l); mu.Unlock() })})
	drain(t, r)
	got := e.copies(t)
	if len(got) != len(ids) {
		t.Fatalf("stream holds %d IDs, want %d", len(got), len(ids))
	}
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("%s: %d copies in the stream", id, got[id])
		}
	}
	if got["rolled-back"] != 0 {
		t.Fatal("a rolled-back intent was published")
	}
	if s := r.Stats(); s.Sent != 1200 || s.Duplicates != 0 || s.Failed != 0 || lags != 1200 {
		t.Fatalf("stats %+v, %d lags", s, lags)
	}
	if n := e.pending(t); n != 0 {
		t.Fatalf("%d rows still pending", n)
	}
}

// TestRelayCrashPoints: a relay that dies before publishing, while waiting
// for PubAcks, or between the PubAcks and the mark leaves its rows pending;
// the next relay publishes them again with the same IDs, and the stream
// holds each ID once.
func TestRelayCrashPoints(t *testing.T) {
	t.Parallel()
	for _, pt := range []hook.Point{failpoint.RelayBeforePublish, failpoint.RelayPubAckWait, failpoint.RelayBeforeMark} {
		t.Run(pt.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ids := e.add(t, "k", 300)
			fp := failpoint.New()
			fp.Enable(pt, 1)
			first := quickRelay(t, e, outbox.RelayConfig{Batch: 100})
			fp.Attach(first)
			err := first.Run(context.Background())
			if !failpoint.IsCrash(err) || fp.Hits(pt) != 1 {
				t.Fatalf("first relay: %v (hits %d), want a crash at %s", err, fp.Hits(pt), pt)
			}
			if n := e.pending(t); n != 300 {
				t.Fatalf("after the crash %d rows pending, want all 300 (the crashed batch unmarked)", n)
			}
			second := quickRelay(t, e, outbox.RelayConfig{Batch: 100})
			drain(t, second)
			got := e.copies(t)
			for _, id := range ids {
				if got[id] != 1 {
					t.Fatalf("%s: %d copies in the stream after a crash at %s", id, got[id], pt)
				}
			}
			s := second.Stats()
			if s.Sent != 300 {
				t.Fatalf("second relay sent %d, want 300", s.Sent)
			}
			if pt == failpoint.RelayBeforeMark && s.Duplicates != 100 {
				t.Fatalf("after a crash between publish and mark the stream should hold the first batch already: %d duplicates, want 100", s.Duplicates)
			}
			if pt == failpoint.RelayBeforePublish && s.Duplicates != 0 {
				t.Fatalf("nothing was published before the crash, yet %d duplicates", s.Duplicates)
			}
		})
	}
}

// TestRelaysDoNotFight: three relays on one outbox publish every row once
// between them: no row is taken by two relays at the same time.
func TestRelaysDoNotFight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.add(t, "f", 3000)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	relays := make([]*outbox.Relay, 3)
	for i := range relays {
		relays[i] = quickRelay(t, e, outbox.RelayConfig{Batch: 50})
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := relays[i].Run(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for e.pending(t) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	var sent, dups int64
	busy := 0
	for _, r := range relays {
		s := r.Stats()
		sent, dups = sent+s.Sent, dups+s.Duplicates
		if s.Sent > 0 {
			busy++
		}
	}
	if sent != int64(len(ids)) || dups != 0 {
		t.Fatalf("relays sent %d rows with %d duplicates between them, want %d and 0: two relays took the same rows", sent, dups, len(ids))
	}
	if busy < 2 {
		t.Errorf("only %d of 3 relays sent anything", busy)
	}
	if got := e.copies(t); len(got) != len(ids) {
		t.Fatalf("stream holds %d IDs, want %d", len(got), len(ids))
	}
}

// TestRelayWakesOnCommit: an idle relay whose poll is a minute away
// publishes a new row within moments of its COMMIT: PostgreSQL notifies it.
func TestRelayWakesOnCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := quickRelay(t, e, outbox.RelayConfig{Idle: jitter.Policy{Kind: jitter.Full, Base: time.Minute, Cap: time.Minute}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// Let it find the outbox empty and go to sleep, listening.
	time.Sleep(300 * time.Millisecond)
	for i := range 3 {
		start := time.Now()
		e.add(t, fmt.Sprintf("w%d", i), 1)
		for r.Stats().Sent < int64(i+1) {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("row %d not published %v after its COMMIT: the relay did not wake", i, time.Since(start))
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("row %d published %v after its COMMIT", i, time.Since(start))
	}
	// Rows written with COPY (AddFresh) fire the trigger too.
	start := time.Now()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ins []inbox.Intent
	for i := range 100 {
		ins = append(ins, inbox.Intent{ID: fmt.Sprintf("copy-%d", i), Subject: "notifications.x"})
	}
	if err := pgoutbox.AddFresh(ctx, tx, ins...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for r.Stats().Sent < 103 {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("rows added with COPY not published %v after their COMMIT", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRelayKeepsWhatDidNotGetThrough: a row whose publish gets no PubAck
// (no stream captures its subject yet) stays pending; once the stream
// exists the next round sends it. A row another stream captures is refused
// for good: marked failed, never retried, never deleted by Prune.
func TestRelayKeepsWhatDidNotGetThrough(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	if _, err := jsinbox.EnsureStream(ctx, e.js, jsinbox.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, in := range []inbox.Intent{{ID: "late-1", Subject: "later.x"}, {ID: "wrong-1", Subject: "other.x"}, {ID: "ok-1", Subject: "notifications.x"}} {
		if err := pgoutbox.Add(ctx, e.pool, in); err != nil {
			t.Fatal(err)
		}
	}
	r := quickRelay(t, e, outbox.RelayConfig{Publisher: jsinbox.PublisherConfig{AckTimeout: 5 * time.Second,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond, MaxAttempts: 2}}})
	n, err := r.Round(ctx)
	if n != 3 || err == nil || !strings.Contains(err.Error(), "1 of 3 rows not acknowledged") {
		t.Fatalf("round: %d, %v", n, err)
	}
	if s := r.Stats(); s.Sent != 1 || s.Failed != 1 || s.Retried != 1 {
		t.Fatalf("stats %+v, want 1 sent, 1 failed, 1 retried", s)
	}
	var failed string
	if err := e.pool.QueryRow(ctx, `SELECT failed FROM outbox WHERE id = 'wrong-1'`).Scan(&failed); err != nil || !strings.Contains(failed, "another stream") {
		t.Fatalf("wrong-1 failed = %q, %v", failed, err)
	}
	// Later: the stream for "later.>" exists (say, the subjects of
	// NOTIFICATIONS were extended); the row goes out.
	s, err := e.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Subjects = append(cfg.Subjects, "later.>")
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Round(ctx); n != 1 || err != nil {
		t.Fatalf("round after the stream caught up: %d, %v (the failed row must not be tried again)", n, err)
	}
	if got := e.copies(t); got["late-1"] != 1 || got["ok-1"] != 1 || len(got) != 2 {
		t.Fatalf("stream: %v", got)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '30 days'`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Prune(ctx, outbox.PruneOptions{OlderThan: 24 * time.Hour, ReplayHorizon: 24 * time.Hour}); !errors.Is(err, inbox.ErrUnsafeHorizon) {
		t.Fatalf("prune inside the horizon: %v", err)
	}
	if n, err := e.st.Prune(ctx, outbox.PruneOptions{OlderThan: 48 * time.Hour, ReplayHorizon: 24 * time.Hour, BatchSize: 1}); n != 2 || err != nil {
		t.Fatalf("prune: %d, %v; want the 2 sent rows", n, err)
	}
	var left string
	if err := e.pool.QueryRow(ctx, `SELECT string_agg(id, ',') FROM outbox`).Scan(&left); err != nil || left != "wrong-1" {
		t.Fatalf("after prune: %q, %v", left, err)
	}
}

// TestPruneKeepsPendingRows: old pending rows are never deleted, young sent
// ones neither; a repeat of a pruned ID could be added again, which is why
// the horizon check exists.
func TestPruneKeepsPendingRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.add(t, "p", 10)
	if _, err := e.pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '10 days' WHERE id IN ('p-0', 'p-1', 'p-2')`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE outbox SET sent_at = now() WHERE id IN ('p-1', 'p-2', 'p-3')`); err != nil {
		t.Fatal(err)
	}
	n, err := e.st.Prune(ctx, outbox.PruneOptions{OlderThan: 5 * 24 * time.Hour, ReplayHorizon: 24 * time.Hour})
	if err != nil || n != 2 {
		t.Fatalf("prune: %d, %v; want p-1 and p-2 (old and sent)", n, err)
	}
	var left int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil || left != 8 {
		t.Fatalf("%d rows left, want 8", left)
	}
	if _, err := e.st.Prune(ctx, outbox.PruneOptions{OlderThan: time.Hour}); err == nil {
		t.Fatal("prune without a horizon")
	}
}

// TestSentStaysSentPendingStays: whatever the role (here the table's
// owner), a sent row's sent_at never changes again, which would publish it
// anew after the stream's duplicate window, and a pending row cannot be
// deleted, which would lose it. The relay's marks, an operator's deletion
// of a failed row and the retention of sent rows still work.
func TestSentStaysSentPendingStays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.add(t, "g", 4)
	for _, q := range []string{
		// The relay's marks (the Store's Take and Finish).
		`UPDATE outbox SET sent_at = clock_timestamp() WHERE id = ANY(ARRAY['g-0'])`,
		`UPDATE outbox SET failed = f.reason FROM unnest(ARRAY['g-1'], ARRAY['refused']) AS f(id, reason) WHERE outbox.id = f.id`,
		// An operator gives a failed row another try, or gives it up.
		`UPDATE outbox SET failed = NULL WHERE id = 'g-1'`,
		`UPDATE outbox SET failed = 'refused again' WHERE id = 'g-1'`,
		`DELETE FROM outbox WHERE id = 'g-1'`,
		// A change to a sent row that leaves sent_at alone.
		`UPDATE outbox SET failed = NULL WHERE id = 'g-0'`,
	} {
		if _, err := e.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, c := range []struct{ q, why string }{
		{`UPDATE outbox SET sent_at = NULL WHERE id = 'g-0'`, "sent_at never changes once set"},
		{`UPDATE outbox SET sent_at = now() - interval '1 day' WHERE id = 'g-0'`, "sent_at never changes once set"},
		{`UPDATE outbox SET sent_at = NULL`, "sent_at never changes once set"},
		{`DELETE FROM outbox WHERE id = 'g-2'`, "only a sent or failed row can be deleted"},
		{`DELETE FROM outbox`, "only a sent or failed row can be deleted"},
	} {
		if _, err := e.pool.Exec(ctx, c.q); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: %v, want refused: %s", c.q, err, c.why)
		}
	}
	var rows string
	if err := e.pool.QueryRow(ctx, `SELECT string_agg(id || ':' || (sent_at IS NOT NULL)::text, ',' ORDER BY id) FROM outbox`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != "g-0:true,g-2:false,g-3:false" {
		t.Errorf("rows after the refused statements: %s", rows)
	}
	// Retention deletes the old sent row and keeps the pending ones.
	if _, err := e.pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '10 days'`); err != nil {
		t.Fatal(err)
	}
	if n, err := e.st.Prune(ctx, outbox.PruneOptions{OlderThan: 5 * 24 * time.Hour, ReplayHorizon: 24 * time.Hour}); err != nil || n != 1 {
		t.Errorf("prune: %d, %v; want the one sent row", n, err)
	}
}

// TestAddFresh: a big batch of new intents goes in with COPY; one whose ID is
// there already fails it with ErrNotFresh (the transaction is aborted), and
// Add then takes the same batch, the repeat included.
func TestAddFresh(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	batch := func(prefix string) []inbox.Intent {
		var ins []inbox.Intent
		for i := range 100 {
			ins = append(ins, inbox.Intent{ID: fmt.Sprintf("%s-%d", prefix, i), Subject: "notifications.x", Payload: []byte{byte(i)}, Parent: fmt.Sprintf("m-%d", i)})
		}
		return ins
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgoutbox.AddFresh(ctx, tx, batch("a")...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	mixed := append(batch("b"), batch("a")[42])
	tx, err = e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgoutbox.AddFresh(ctx, tx, mixed...); !errors.Is(err, pgoutbox.ErrNotFresh) {
		t.Fatalf("AddFresh with an ID already there: %v, want ErrNotFresh", err)
	}
	_ = tx.Rollback(ctx)
	if err := pgoutbox.Add(ctx, e.pool, mixed...); err != nil {
		t.Fatalf("Add after ErrNotFresh: %v", err)
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 200 {
		t.Fatalf("%d rows, %v; want 200", n, err)
	}
	r := quickRelay(t, e, outbox.RelayConfig{})
	drain(t, r)
	if got := e.copies(t); len(got) != 200 {
		t.Fatalf("stream holds %d IDs", len(got))
	}
}

// TestRelayEndsOnAClosedConnection: nats.go never reopens a connection it
// closed (Close, or a protocol error the server closed it for). A relay
// left with one could publish nothing again; it must end with an error
// saying so, for its supervisor to restart it, not idle on as if healthy.
func TestRelayEndsOnAClosedConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := quickRelay(t, e, outbox.RelayConfig{})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- r.Run(ctx) }()
	e.js.Conn().Close()
	select {
	case err := <-done:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("Run: %v, want an error wrapping nats.ErrConnectionClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the relay still runs 30s after its connection closed for good")
	}
}

// TestListenOnEveryKindOfStore: a store listens on a connection of its
// own whatever it was made from: a pool (one taken out of it), a single
// *pgx.Conn (a second connection with its configuration; the relay's
// batches hold the first), or another pool given with WithListen (a direct
// one behind a pooler). A COMMIT that adds a row wakes each waiter long
// before its poll would have.
func TestListenOnEveryKindOfStore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, e.pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	other, err := pgxpool.New(ctx, e.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	stores := map[string]*pgoutbox.Store{
		"pool":       e.st,
		"conn":       pgoutbox.New(conn),
		"WithListen": pgoutbox.New(conn).WithListen(other),
	}
	for name, st := range stores {
		w, err := st.Listen(ctx)
		if err != nil {
			t.Fatalf("%s: listen: %v", name, err)
		}
		defer w.Close()
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- w.Wait(ctx, time.Minute) }()
		time.Sleep(50 * time.Millisecond)
		e.add(t, "listen-"+strings.ToLower(name), 1)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: wait: %v", name, err)
			}
			t.Logf("%s: woke %v after the wait began", name, time.Since(start))
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no notification 10s after a COMMIT that added a row", name)
		}
	}
	tk, err := pgoutbox.New(conn).Take(ctx, 10)
	if err != nil {
		t.Fatalf("take on a *pgx.Conn: %v", err)
	}
	if len(tk.Rows()) != len(stores) {
		t.Errorf("took %d rows on a *pgx.Conn, want the %d added", len(tk.Rows()), len(stores))
	}
	tk.Abandon(ctx)
}
