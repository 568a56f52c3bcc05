package pginbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// standbyless returns the URL of a migrated database on a server whose
// synchronous standby never answers (every writing COMMIT waits until it
// is cancelled) and a watched pool on it whose sessions commit without
// waiting, for setting up and reading back.
func standbyless(t *testing.T) (url string, local *pgxpool.Pool) {
	t.Helper()
	srv := testenv.NewStandbyless(t)
	ctx := context.Background()
	url, err := srv.CreateDatabase(ctx, "sync")
	if err != nil {
		t.Fatal(err)
	}
	local = newDBAt(t, url+"&synchronous_commit=local")
	if err := srv.SetSynchronousStandby(ctx, testenv.AbsentStandby); err != nil {
		t.Fatal(err)
	}
	return url, local
}

func watchedPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pginbox.NewPool(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func cancelWaits(t *testing.T, url string) *testenv.SyncRepCanceller {
	t.Helper()
	c, err := testenv.StartSyncRepCanceller(context.Background(), url, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.Stop() })
	return c
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCommitWithCancelledSyncWaitIsNotAcked: a COMMIT whose wait for the
// synchronous standby is cancelled (pg_cancel_backend) returns success
// with a warning and is committed on the primary only. Nothing of the
// batch is ackable; the redelivery finds the rows, and its commit, which
// wrote nothing, waits for the standby too (it writes WAL of its own):
// cancelled again, its duplicates are not ackable either.
func TestCommitWithCancelledSyncWaitIsNotAcked(t *testing.T) {
	url, local := standbyless(t)
	p := newLedgerProcessor(t, watchedPool(t, url))
	canceller := cancelWaits(t, url)
	ctx := context.Background()
	batch := func() []inbox.Message {
		return []inbox.Message{intent("sync-1", 1, 10), intent("sync-2", 2, 20), intent("sync-3", 3, 30)}
	}

	out, err := p.Process(ctx, batch())
	if !errors.Is(err, inbox.ErrOutcomeUnknown) || !errors.Is(err, pginbox.ErrCommitNotReplicated) {
		t.Fatalf("first delivery: err = %v, want the outcome unknown: commit not replicated", err)
	}
	for i, o := range out {
		if o.Ackable() {
			t.Fatalf("first delivery: message %d is ackable (%v) on a commit the standby never confirmed", i, o.Status)
		}
	}
	if n := countRows(t, local, `SELECT count(*) FROM inbox WHERE scope = 'ledger'`); n != 3 {
		t.Fatalf("%d inbox rows: the cancelled commit should have committed locally", n)
	}

	msgs := batch()
	for i := range msgs {
		msgs[i].Deliveries = 2
	}
	out, err = p.Process(ctx, msgs)
	if !errors.Is(err, pginbox.ErrCommitNotReplicated) {
		t.Fatalf("redelivery: err = %v, want the outcome unknown: its commit too must wait for the standby", err)
	}
	for i, o := range out {
		if o.Ackable() {
			t.Fatalf("redelivery: message %d is ackable (%v): a duplicate acked on a row the standby may lack", i, o.Status)
		}
	}
	// The canceller counts a cancel once its query returned, which may be
	// after the cancelled COMMIT came back here: wait for the count.
	for deadline := time.Now().Add(30 * time.Second); canceller.Cancelled() < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d waits cancelled, want 2", canceller.Cancelled())
		}
	}
	if n := countRows(t, local, `SELECT count(*) FROM ledger_entries`); n != 3 {
		t.Fatalf("%d ledger entries, want 3 (each effect once)", n)
	}
}

// TestCommitTimeoutDuringSyncWaitIsNotAcked: a COMMIT that outlives
// CommitTimeout while it waits for the synchronous standby makes pgx send
// a cancel request, which ends the wait the same way: unknown, not acked.
func TestCommitTimeoutDuringSyncWaitIsNotAcked(t *testing.T) {
	url, _ := standbyless(t)
	p, err := inbox.NewProcessor(pginbox.New(watchedPool(t, url)), effects.NewLedger(), inbox.Config{Scope: "ledger", CommitTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Process(context.Background(), []inbox.Message{intent("timeout-1", 1, 10)})
	t.Logf("commit: %v", err)
	if !errors.Is(err, inbox.ErrOutcomeUnknown) {
		t.Fatalf("err = %v, want the outcome unknown", err)
	}
	if out[0].Ackable() {
		t.Fatal("the message is ackable after a commit whose wait for the standby timed out")
	}
}

// TestDuplicatesAckedOnDurableCommit: with a standby that answers (the
// shared server: synchronous_commit=on flushes locally), a batch of
// duplicates is acked as before.
func TestDuplicatesAckedOnDurableCommit(t *testing.T) {
	t.Parallel()
	p := newLedgerProcessor(t, newDB(t))
	ctx := context.Background()
	msgs := []inbox.Message{intent("dup-1", 1, 10), intent("dup-2", 2, 20)}
	for round := range 2 {
		out, err := p.Process(ctx, msgs)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i, o := range out {
			if !o.Ackable() {
				t.Fatalf("round %d: message %d not ackable: %v", round, i, o.Status)
			}
		}
	}
}

// TestCommitWatchCheck: the store tells a pool that does not report the
// warning (made without WatchCommits, or whose notice handler was
// replaced after it) from one that does, and WatchCommits keeps the
// handler a configuration had.
func TestCommitWatchCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.NewDatabase(t)
	plain, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := pginbox.New(plain).CheckCommitWatch(ctx); !errors.Is(err, pginbox.ErrCommitsUnwatched) {
		t.Fatalf("plain pool: %v, want ErrCommitsUnwatched", err)
	}
	if _, err := pginbox.New(plain).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pginbox.New(plain).Warm(ctx, 1, func(context.Context, pgx.Tx) error { return nil }); !errors.Is(err, pginbox.ErrCommitsUnwatched) {
		t.Fatalf("Warm on a plain pool: %v, want ErrCommitsUnwatched", err)
	}

	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pginbox.WatchCommits(cfg.ConnConfig)
	cfg.ConnConfig.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) {} // drops the watch
	dropped, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dropped.Close()
	if err := pginbox.New(dropped).CheckCommitWatch(ctx); !errors.Is(err, pginbox.ErrCommitsUnwatched) {
		t.Fatalf("replaced handler: %v, want ErrCommitsUnwatched", err)
	}

	cfg, err = pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var mine []string
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { mine = append(mine, n.Message) }
	pginbox.WatchCommits(cfg.ConnConfig)
	chained, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer chained.Close()
	if err := pginbox.New(chained).CheckCommitWatch(ctx); err != nil {
		t.Fatalf("watched pool: %v", err)
	}
	if len(mine) != 1 {
		t.Fatalf("the configuration's own handler saw %q, want the probe", mine)
	}
}

// TestCheckRefusesUnwatchedPoolOnSyncStandby: a pool made without the
// watch cannot see a COMMIT whose wait for the standby was cancelled; on a
// server that waits for a synchronous standby, the store's check (the
// consumer's start and its resume after an outage) refuses it, saying
// what to do. Without a synchronous standby it passes, and so does a
// watched pool.
func TestCheckRefusesUnwatchedPoolOnSyncStandby(t *testing.T) {
	ctx := context.Background()
	url, _ := standbyless(t)
	plain, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	err = pginbox.New(plain).Check(ctx)
	if !errors.Is(err, inbox.ErrDatabaseUnfit) || !strings.Contains(err.Error(), "pginbox.NewPool") {
		t.Fatalf("plain pool before a synchronous standby: %v, want ErrDatabaseUnfit naming pginbox.NewPool", err)
	}
	if err := pginbox.New(watchedPool(t, url)).Check(ctx); err != nil {
		t.Fatalf("watched pool: %v", err)
	}
	other, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := pginbox.New(other).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pginbox.New(other).Check(ctx); err != nil {
		t.Fatalf("plain pool, no synchronous standby: %v", err)
	}
}
