package sqliteoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

func TestMain(m *testing.M) { testenv.MainNoLeaks(m) }

type env struct {
	db *sql.DB
	js jetstream.JetStream
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	db, err := sqliteinbox.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if n, err := sqliteoutbox.Migrate(ctx, db); err != nil || n != 1 {
		t.Fatalf("migrate: %d, %v", n, err)
	}
	if err := sqliteoutbox.CheckSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	srv := testenv.NewNATS(t, testenv.NATSOptions{})
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

func (e *env) add(t *testing.T, ins ...outbox.Intent) error {
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
	r, err := outbox.NewRelayOn(sqliteoutbox.Source(e.db, lease), e.js, outbox.RelayConfig{Stream: "NOTIFICATIONS", Batch: 100,
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

func intents(prefix string, n int) []outbox.Intent {
	out := make([]outbox.Intent, n)
	for i := range out {
		out[i] = outbox.Intent{ID: fmt.Sprintf("%s-%d", prefix, i), Subject: "notifications.x", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
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
	if err := e.add(t, other); !errors.Is(err, outbox.ErrConflict) {
		t.Fatalf("another payload: %v", err)
	}
	if err := e.add(t, outbox.Intent{ID: "x", Subject: "a.>"}); !errors.Is(err, outbox.ErrBadIntent) {
		t.Fatalf("a wildcard subject: %v", err)
	}
	tx, _ := e.db.BeginTx(context.Background(), nil)
	if err := sqliteoutbox.Add(context.Background(), tx, outbox.Intent{ID: "rolled-back", Subject: "notifications.x"}); err != nil {
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
	if n, err := sqliteoutbox.Prune(context.Background(), e.db, outbox.PruneOptions{OlderThan: 3 * time.Hour, ReplayHorizon: time.Hour}); err != nil || n != 0 {
		t.Fatalf("prune of young rows: %d, %v", n, err)
	}
	if _, err := e.db.Exec(`UPDATE outbox SET created_at = created_at - 86400000000`); err != nil {
		t.Fatal(err)
	}
	if n, err := sqliteoutbox.Prune(context.Background(), e.db, outbox.PruneOptions{OlderThan: 3 * time.Hour, ReplayHorizon: time.Hour, BatchSize: 7}); err != nil || n != 250 {
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
