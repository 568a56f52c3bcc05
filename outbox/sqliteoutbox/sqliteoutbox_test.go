package sqliteoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

func TestMain(m *testing.M) { testenv.MainNoLeaks(m) }

type env struct {
	db *sql.DB
	js jetstream.JetStream
}

// newDB returns a fresh SQLite file with the outbox migrated.
func newDB(t *testing.T) *sql.DB {
	t.Helper()
	ctx := context.Background()
	db, err := sqliteinbox.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	// The outbox store as an embedder gets it: from the inbox's store.
	st := sqliteinbox.New(db).Outbox()
	if n, err := st.Migrate(ctx); err != nil || n != 2 {
		t.Fatalf("migrate: %d, %v", n, err)
	}
	if err := st.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	return db
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	db := newDB(t)
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{Name: "NOTIFICATIONS", Subjects: []string{"notifications.>"}}); err != nil {
		t.Fatal(err)
	}
	return &env{db: db, js: js}
}

func (e *env) add(t *testing.T, ins ...inbox.Intent) error {
	t.Helper()
	tx, err := e.db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if err := sqliteoutbox.Add(context.Background(), tx, ins...); err != nil {
		return err
	}
	return tx.Commit()
}

func (e *env) relay(t *testing.T, lease time.Duration) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(sqliteoutbox.New(e.db).WithLease(lease), e.js, outbox.RelayConfig{Stream: "NOTIFICATIONS", Batch: 100,
		Idle:  jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond},
		Retry: jitter.Policy{Kind: jitter.Full, Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// copies counts the stream's messages per ID.
func (e *env) copies(t *testing.T) map[string]int {
	t.Helper()
	return pipelinetest.CopiesByID(t, e.js, "NOTIFICATIONS")
}

func (e *env) pending(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.QueryRow(`SELECT count(*) FROM outbox WHERE sent_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func intents(prefix string, n int) []inbox.Intent {
	out := make([]inbox.Intent, n)
	for i := range out {
		out[i] = inbox.Intent{ID: fmt.Sprintf("%s-%d", prefix, i), Subject: "notifications.x", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	return out
}

// TestSQLiteAddAndRelay: the same contract as on PostgreSQL: a repeat is a
// no-op, another payload a conflict, a rolled-back transaction emits
// nothing, and the relay sends each row once.
func TestSQLiteAddAndRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ins := intents("s", 250)
	if err := e.add(t, ins...); err != nil {
		t.Fatal(err)
	}
	if err := e.add(t, ins[:10]...); err != nil {
		t.Fatalf("a repeat: %v", err)
	}
	other := ins[3]
	other.Payload = []byte("other")
	if err := e.add(t, other); !errors.Is(err, inbox.ErrConflict) {
		t.Fatalf("another payload: %v", err)
	}
	if err := e.add(t, inbox.Intent{ID: "x", Subject: "a.>"}); !errors.Is(err, inbox.ErrBadIntent) {
		t.Fatalf("a wildcard subject: %v", err)
	}
	tx, _ := e.db.BeginTx(context.Background(), nil)
	if err := sqliteoutbox.Add(context.Background(), tx, inbox.Intent{ID: "rolled-back", Subject: "notifications.x"}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()
	r := e.relay(t, time.Minute)
	for {
		n, err := r.Round(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	got := e.copies(t)
	if len(got) != 250 || got["rolled-back"] != 0 {
		t.Fatalf("stream holds %d IDs (rolled-back: %d)", len(got), got["rolled-back"])
	}
	for id, n := range got {
		if n != 1 {
			t.Fatalf("%s: %d copies", id, n)
		}
	}
	if s := r.Stats(); s.Sent != 250 || s.Duplicates != 0 || e.pending(t) != 0 {
		t.Fatalf("stats %+v, %d pending", s, e.pending(t))
	}
	if n, err := sqliteoutbox.New(e.db).Prune(context.Background(), outbox.PruneOptions{OlderThan: 3 * time.Hour, ReplayHorizon: time.Hour}); err != nil || n != 0 {
		t.Fatalf("prune of young rows: %d, %v", n, err)
	}
	if _, err := e.db.Exec(`UPDATE outbox SET created_at = created_at - 86400000000`); err != nil {
		t.Fatal(err)
	}
	if n, err := sqliteoutbox.New(e.db).Prune(context.Background(), outbox.PruneOptions{OlderThan: 3 * time.Hour, ReplayHorizon: time.Hour, BatchSize: 7}); err != nil || n != 250 {
		t.Fatalf("prune: %d, %v", n, err)
	}
}

// TestSQLiteRelayCrashes: a relay that dies at any of its points leaves its
// rows leased; once the lease runs out the next relay sends them, and the
// stream holds each ID once.
func TestSQLiteRelayCrashes(t *testing.T) {
	t.Parallel()
	for _, pt := range []hook.Point{failpoint.RelayBeforePublish, failpoint.RelayPubAckWait, failpoint.RelayBeforeMark} {
		t.Run(pt.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			if err := e.add(t, intents("k", 300)...); err != nil {
				t.Fatal(err)
			}
			fp := failpoint.New()
			fp.Enable(pt, 1)
			first := e.relay(t, 300*time.Millisecond)
			fp.Attach(first)
			if err := first.Run(context.Background()); !failpoint.IsCrash(err) {
				t.Fatalf("first relay: %v", err)
			}
			second := e.relay(t, 300*time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- second.Run(ctx) }()
			for e.pending(t) > 0 && ctx.Err() == nil {
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			got := e.copies(t)
			if len(got) != 300 {
				t.Fatalf("stream holds %d IDs", len(got))
			}
			for id, n := range got {
				if n != 1 {
					t.Fatalf("%s: %d copies after a crash at %s", id, n, pt)
				}
			}
		})
	}
}

// TestSQLiteRelaysDoNotFight: three relays on one file send every row once
// between them.
func TestSQLiteRelaysDoNotFight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := e.add(t, intents("f", 1500)...); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	relays := make([]*outbox.Relay, 3)
	for i := range relays {
		relays[i] = e.relay(t, time.Minute)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := relays[i].Run(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	for deadline := time.Now().Add(time.Minute); e.pending(t) > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	var sent, dups int64
	for _, r := range relays {
		s := r.Stats()
		sent, dups = sent+s.Sent, dups+s.Duplicates
	}
	if sent != 1500 || dups != 0 {
		t.Fatalf("sent %d with %d duplicates, want 1500 and 0", sent, dups)
	}
}

// rowState is what the file says of one outbox row: "sent", "failed",
// "leased" or "free".
func rowState(t *testing.T, db *sql.DB, id string) string {
	t.Helper()
	var sent, lease sql.NullInt64
	var failed sql.NullString
	if err := db.QueryRow(`SELECT sent_at, failed, lease_until FROM outbox WHERE id = ?`, id).Scan(&sent, &failed, &lease); err != nil {
		t.Fatal(err)
	}
	switch {
	case sent.Valid:
		return "sent"
	case failed.Valid:
		return "failed"
	case lease.Valid && lease.Int64 > time.Now().UnixMicro():
		return "leased"
	}
	return "free"
}

func ids(rows []outbox.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// TestSQLiteLapsedLeaseTouchesOnlyItsRows: a relay whose lease ran out
// while it held a batch, part of which another relay has leased since,
// finishes and abandons only the rows it still holds. The other relay's
// rows stay unmarked and leased to it, so no third relay takes them, and
// Finish names the rows it could not mark instead of reporting them
// sent.
func TestSQLiteLapsedLeaseTouchesOnlyItsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := &env{db: newDB(t)}
	if err := e.add(t, intents("l", 6)...); err != nil {
		t.Fatal(err)
	}
	const short = 50 * time.Millisecond
	first, err := sqliteoutbox.New(e.db).WithLease(short).Take(ctx, 10)
	if err != nil || len(first.Rows()) != 6 {
		t.Fatalf("first take: %v, %v", first, err)
	}
	time.Sleep(2 * short)
	second, err := sqliteoutbox.New(e.db).WithLease(time.Minute).Take(ctx, 3)
	if err != nil || !slices.Equal(ids(second.Rows()), []string{"l-0", "l-1", "l-2"}) {
		t.Fatalf("second take after the first's lease ran out: %v, %v", second, err)
	}

	// The first relay marks its whole batch: of it, it still holds l-3..l-5
	// (lapsed, but nobody took them), the second holds the others.
	lags, err := first.Finish(ctx, []string{"l-0", "l-1", "l-3", "l-4"}, map[string]string{"l-2": "refused", "l-5": "refused"})
	var notHeld *outbox.NotHeldError
	if !errors.As(err, &notHeld) {
		t.Fatalf("finish of a batch partly taken over: %v, want an outbox.NotHeldError", err)
	}
	slices.Sort(notHeld.IDs)
	if !slices.Equal(notHeld.IDs, []string{"l-0", "l-1", "l-2"}) || len(lags) != 2 {
		t.Fatalf("finish: not held %v, %d lags; want l-0..l-2 and 2 lags", notHeld.IDs, len(lags))
	}
	for id, want := range map[string]string{"l-0": "leased", "l-1": "leased", "l-2": "leased", "l-3": "sent", "l-4": "sent", "l-5": "failed"} {
		if got := rowState(t, e.db, id); got != want {
			t.Errorf("after the lapsed finish, %s is %s, want %s", id, got, want)
		}
	}
	if third, err := sqliteoutbox.New(e.db).WithLease(time.Minute).Take(ctx, 10); err != nil || len(third.Rows()) != 0 {
		t.Fatalf("a third relay took %v (%v) while the second holds them", third, err)
	}
	if lags, err := second.Finish(ctx, []string{"l-0", "l-1", "l-2"}, nil); err != nil || len(lags) != 3 {
		t.Fatalf("the holder's finish: %d lags, %v", len(lags), err)
	}

	// Abandon: the first relay lets go of a batch the second partly took.
	if err := e.add(t, intents("m", 4)...); err != nil {
		t.Fatal(err)
	}
	first, err = sqliteoutbox.New(e.db).WithLease(short).Take(ctx, 10)
	if err != nil || len(first.Rows()) != 4 {
		t.Fatalf("first take of m: %v, %v", first, err)
	}
	time.Sleep(2 * short)
	second, err = sqliteoutbox.New(e.db).WithLease(time.Minute).Take(ctx, 2)
	if err != nil || !slices.Equal(ids(second.Rows()), []string{"m-0", "m-1"}) {
		t.Fatalf("second take of m: %v, %v", second, err)
	}
	first.Abandon(ctx)
	third, err := sqliteoutbox.New(e.db).WithLease(time.Minute).Take(ctx, 10)
	if err != nil || !slices.Equal(ids(third.Rows()), []string{"m-2", "m-3"}) {
		t.Fatalf("after the lapsed abandon a third relay took %v (%v), want m-2 and m-3 only", ids(third.Rows()), err)
	}
}

// TestSQLiteRelayOutlivesItsLease: a relay that stalls between its
// PubAcks and its mark for longer than its lease, while a second relay
// takes the batch over and publishes it again, neither marks the
// second's rows nor counts them sent: it counts them taken over. The
// second marks them; a third finds nothing to take meanwhile, and the
// stream holds each ID once.
func TestSQLiteRelayOutlivesItsLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	const n = 50
	if err := e.add(t, intents("o", n)...); err != nil {
		t.Fatal(err)
	}
	// pause stops r once before its mark; it reports arriving there on
	// the first channel and goes on when the second closes.
	pause := func(r *outbox.Relay) (chan struct{}, chan struct{}) {
		at, resume := make(chan struct{}), make(chan struct{})
		var once sync.Once
		hook.Attach(r, func(p hook.Point) bool {
			if p == hook.RelayBeforeMark {
				once.Do(func() { close(at); <-resume })
			}
			return false
		})
		return at, resume
	}
	const lease = 200 * time.Millisecond
	first := e.relay(t, lease)
	firstAt, firstGo := pause(first)
	firstDone := make(chan error, 1)
	go func() { _, err := first.Round(ctx); firstDone <- err }()
	<-firstAt
	time.Sleep(lease + 50*time.Millisecond)

	second := e.relay(t, time.Minute)
	secondAt, secondGo := pause(second)
	secondDone := make(chan error, 1)
	go func() { _, err := second.Round(ctx); secondDone <- err }()
	<-secondAt

	close(firstGo)
	if err := <-firstDone; err != nil {
		t.Fatalf("the lapsed relay's round: %v", err)
	}
	if k, err := e.relay(t, time.Minute).Round(ctx); err != nil || k != 0 {
		t.Fatalf("a third relay took %d rows (%v) while the second holds them", k, err)
	}
	close(secondGo)
	if err := <-secondDone; err != nil {
		t.Fatalf("the holder's round: %v", err)
	}
	if s := first.Stats(); s.Sent != 0 || s.TakenOver != n {
		t.Errorf("the lapsed relay: %+v, want nothing sent and %d taken over", s, n)
	}
	if s := second.Stats(); s.Sent != n || s.Duplicates != n || s.TakenOver != 0 {
		t.Errorf("the holder: %+v, want %d sent, all duplicates", s, n)
	}
	if p := e.pending(t); p != 0 {
		t.Errorf("%d rows pending", p)
	}
	for id, c := range e.copies(t) {
		if c != 1 {
			t.Errorf("%s: %d copies", id, c)
		}
	}
}
