package jsinboxtest

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
)

// quick are the consumer timings of these tests: every delivery the last,
// short naks and database waits, so that what a fault does to a last
// delivery shows within seconds.
func quick() jsinbox.ConsumerConfig {
	return jsinbox.ConsumerConfig{BatchSize: 20, InFlight: 1, MaxDeliver: 1, AckWait: 2 * time.Second,
		Nak:    jitter.Policy{Kind: jitter.Decorrelated, Base: 50 * time.Millisecond, Cap: 300 * time.Millisecond},
		DBWait: jitter.Policy{Kind: jitter.Decorrelated, Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond}}
}

// dbName is the database a URL names.
func dbName(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// TestRunRefusesUnfitDatabase: a consumer started on a database that
// answers but cannot take a batch (nobody migrated it, it is read-only,
// a pooler in statement mode stands in front of it; a SQLite file nobody
// migrated) returns a SetupError
// that says what to do, instead of consuming and failing every batch until
// MaxDeliver dead-letters the backlog.
func TestRunRefusesUnfitDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	e.publish(t, load(5, "unfit"))
	var migrated string
	if err := e.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&migrated); err != nil {
		t.Fatal(err)
	}
	readOnly := testenv.NewDatabase(t)
	ro, err := pgxpool.New(ctx, readOnly)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pginbox.New(ro).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ro.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{dbName(t, readOnly)}.Sanitize()+` SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	ro.Close()
	stmt := testenv.NewPgBouncer(t, testenv.PgBouncerOptions{PoolMode: "statement"})
	for _, c := range []struct{ name, url, says string }{
		{"unmigrated", testenv.NewDatabase(t), "jetinbox migrate"},
		{"read-only", readOnly, "read-only"},
		{"statement pooler", testenv.WithQueryExecMode(stmt.URL(migrated), "cache_describe"), "statement"},
	} {
		pool, err := pgxpool.New(ctx, c.url)
		if err != nil {
			t.Fatal(err)
		}
		proc, err := inbox.NewProcessor(pginbox.New(pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
		if err != nil {
			t.Fatal(err)
		}
		cons, err := jsinbox.NewConsumer(e.js, proc, quick())
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = cons.Run(rctx)
		cancel()
		pool.Close()
		var setup *jsinbox.SetupError
		if !errors.As(err, &setup) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: Run = %v, want a SetupError saying %q", c.name, err, c.says)
		}
	}
	// SQLite: a file nobody migrated.
	db, err := sqliteinbox.Open(ctx, filepath.Join(t.TempDir(), "unmigrated.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	noop := inbox.HandlerFunc(func(context.Context, *sql.Tx, inbox.Message) error { return nil })
	sproc, err := inbox.NewProcessor(sqliteinbox.New(db), noop, inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := jsinbox.NewConsumer(e.js, sproc, quick())
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = cons.Run(rctx)
	cancel()
	var setup *jsinbox.SetupError
	if !errors.As(err, &setup) || !errors.Is(err, inbox.ErrNotMigrated) {
		t.Errorf("unmigrated SQLite file: Run = %v, want a SetupError wrapping ErrNotMigrated", err)
	}
	if n := dlqCount(t, e); n != 0 {
		t.Fatalf("%d dead letters after consumers refused to start", n)
	}
}

// TestDatabaseFaultsLeaveLastDeliveriesForRescue: while the database is
// read-only, down, or lacks a table the effect writes, a running consumer
// pauses and leaves every message on its last delivery unsettled; none is
// dead-lettered as given up. Once the fault is repaired, the rescue
// applies each from its advisory: every intent applied once, the
// dead-letter stream empty.
func TestDatabaseFaultsLeaveLastDeliveriesForRescue(t *testing.T) {
	t.Parallel()
	type fault struct {
		name   string
		paused bool // Check sees the fault: the consumer stays paused
		// break and repair run on a connection of their own, opened
		// before the fault.
		breakIt, repair func(t *testing.T, admin *pgx.Conn, pg *testenv.Postgres, db string)
	}
	exec := func(t *testing.T, c *pgx.Conn, sql string) {
		t.Helper()
		if _, err := c.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	// Every other session of the database starts again, with the new
	// setting or the renamed table.
	kick := func(t *testing.T, c *pgx.Conn, db string) {
		exec(t, c, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '`+db+`' AND pid <> pg_backend_pid()`)
	}
	for _, f := range []fault{
		{name: "read-only", paused: true,
			breakIt: func(t *testing.T, c *pgx.Conn, _ *testenv.Postgres, db string) {
				exec(t, c, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET default_transaction_read_only = on`)
				kick(t, c, db)
			},
			repair: func(t *testing.T, c *pgx.Conn, _ *testenv.Postgres, db string) {
				exec(t, c, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` RESET default_transaction_read_only`)
				kick(t, c, db)
			}},
		{name: "effect table missing",
			breakIt: func(t *testing.T, c *pgx.Conn, _ *testenv.Postgres, db string) {
				exec(t, c, `ALTER TABLE ledger_entries RENAME TO ledger_entries_away`)
				kick(t, c, db)
			},
			repair: func(t *testing.T, c *pgx.Conn, _ *testenv.Postgres, db string) {
				exec(t, c, `ALTER TABLE ledger_entries_away RENAME TO ledger_entries`)
			}},
		{name: "database down", paused: true,
			breakIt: func(t *testing.T, _ *pgx.Conn, pg *testenv.Postgres, _ string) {
				if err := pg.Stop(); err != nil {
					t.Fatal(err)
				}
			},
			repair: func(t *testing.T, _ *pgx.Conn, pg *testenv.Postgres, _ string) {
				if err := pg.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
			}},
	} {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var pg *testenv.Postgres
			dbURL := ""
			if f.name == "database down" {
				var err error
				if pg, err = testenv.StartPostgres(ctx, testenv.PostgresOptions{}); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { pg.Close() })
				if dbURL, err = pg.CreateDatabase(ctx, "down"); err != nil {
					t.Fatal(err)
				}
			}
			e := newEnv(t, dbURL, jsinbox.StreamConfig{})
			var db string
			if err := e.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
				t.Fatal(err)
			}
			admin, err := pgx.Connect(ctx, e.pool.Config().ConnString())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { admin.Close(context.Background()) }()
			r := e.startConsumer(t, nil, nil, quick())
			waitFor(t, 30*time.Second, r.c.Ready)
			f.breakIt(t, admin, pg, db)
			const n = 12
			e.publish(t, load(n, "fault"))
			// The messages of the first failed batch are left for the
			// rescue (their only delivery); the consumer then pauses, so
			// under load the rest may wait in the stream, undelivered,
			// until the repair. The server gives up on those left after
			// AckWait, and the rescue meets the fault too.
			waitFor(t, time.Minute, func() bool { s := r.c.Stats(); return s.LeftForRescue > 0 || s.DeadLettered > 0 })
			time.Sleep(3 * time.Second)
			s := r.c.Stats()
			if s.DeadLettered != 0 || dlqCount(t, e) != 0 {
				dead := deadLetters(t, e)
				t.Fatalf("during the fault: stats %+v, %d dead letters (first %q); want none: the fault is not the messages'",
					s, len(dead), dead[0].Header[jsinbox.HeaderReason])
			}
			if s.LeftForRescue == 0 || s.Applied != 0 {
				t.Fatalf("during the fault: stats %+v, want last deliveries left for the rescue, nothing applied", s)
			}
			if f.paused && r.c.Ready() {
				t.Fatalf("during the fault the consumer is ready (stats %+v): it should pause while the database cannot take batches", s)
			}
			if s.FailedBatches > 10 {
				t.Fatalf("%d failed batches in a few seconds: the consumer spins on the fault", s.FailedBatches)
			}
			if f.name == "database down" {
				// The admin session died with the server.
				f.repair(t, nil, pg, db)
			} else {
				f.repair(t, admin, pg, db)
			}
			e.pool.Reset() // the test's own reads start on fresh sessions
			waitFor(t, time.Minute, func() bool { return e.verify(t).AppliedOnce == n })
			e.assertClean(t, n)
			if s := r.c.Stats(); s.DeadLettered != 0 || dlqCount(t, e) != 0 || s.Rescued == 0 {
				t.Fatalf("after the repair: stats %+v, %d dead letters; want every intent rescued, none dead-lettered", s, dlqCount(t, e))
			}
		})
	}
}

// TestMovedPartitionLeftForRescue: a sharded consumer holding the last
// delivery of a message whose partition it does not own (the partition
// moved away) leaves it unsettled instead of dead-lettering it "partition
// not owned"; once the partition is owned here (as by the new owner), the
// rescue applies it.
func TestMovedPartitionLeftForRescue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	m := (&shard.Map{Partitions: 4}).WithDefaults()
	if err := m.EnsureStream(ctx, e.js, jsinbox.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	const n = 8
	for _, in := range load(n, "moved") {
		msg := &nats.Msg{Subject: shard.PublishSubject(m.Subject, in.ID, "ledger"), Data: in.Payload, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, in.ID)
		if _, err := e.js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	inner, err := inbox.NewProcessor(pginbox.New(e.pool), effects.NewLedger(), inbox.Config{Scope: m.Scope})
	if err != nil {
		t.Fatal(err)
	}
	sp := shard.NewProcessor(inner, &m) // owns nothing: every partition moved away
	cfg := quick()
	cfg.Stream, cfg.Durable = m.Stream, "moved"
	c, err := jsinbox.NewConsumer(e.js, sp, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	defer func() { stop(); <-done }()
	waitFor(t, 30*time.Second, func() bool { return c.Stats().LeftForRescue >= n || c.Stats().DeadLettered > 0 })
	time.Sleep(3 * time.Second) // past AckWait: the server gave up on them, the rescue met them
	dlq := func() int {
		dead, err := verify.ReadStream(ctx, e.js, jsinbox.DeadLetterStream(m.Stream))
		if err != nil {
			t.Fatal(err)
		}
		return len(dead)
	}
	if s := c.Stats(); s.DeadLettered != 0 || dlq() != 0 || s.LeftForRescue == 0 {
		t.Fatalf("not owned: stats %+v, %d dead letters; want every last delivery left for the rescue", s, dlq())
	}
	all := make(shard.Set, m.Partitions)
	for i := range all {
		all[i] = i
	}
	sp.SetOwned(all)
	waitFor(t, time.Minute, func() bool {
		var k int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE scope = $1 AND status = 'applied'`, m.Scope).Scan(&k); err != nil {
			t.Fatal(err)
		}
		return k == n
	})
	if s := c.Stats(); s.DeadLettered != 0 || dlq() != 0 {
		t.Fatalf("owned again: stats %+v, %d dead letters", s, dlq())
	}
}
