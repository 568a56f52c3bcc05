// Package pgwatch sees what pgx does not report of a COMMIT: the warning
// PostgreSQL sends when a commit's wait for a synchronous standby was
// cancelled. The commit is then durable on the primary only, yet the
// server answers COMMIT with success; a failover to the standby loses it.
// Anything decided outside the database on such a commit (an ack, a sent
// mark) rests on a row the next primary may not have.
//
// [Install] chains a notice handler (and a connect hook that marks the
// connection as watched) onto a pgx connection configuration; [Commit]
// commits a transaction and turns the warning into [ErrNotReplicated];
// [Check] tells whether a database's connections are watched.
package pgwatch

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/inbox"
)

// ErrNotReplicated is wrapped by [Commit] when the server answered a COMMIT
// with success and a warning (inbox.ErrCommitNotReplicated).
var ErrNotReplicated = inbox.ErrCommitNotReplicated

// ErrUnwatched is wrapped by [Check] for a database whose connections do
// not report the warning of a cancelled wait for the synchronous standby
// (inbox.ErrCommitsUnwatched).
var ErrUnwatched = inbox.ErrCommitsUnwatched

// key is the connection's CustomData entry of its watch.
const key = "jetinbox.pgwatch"

// probeMessage is the text of the warning [Check] raises to see the
// handler at work.
const probeMessage = "jetinbox: commit watch probe"

// watch is one connection's state. Its notice handler runs on the
// goroutine reading a result, but a pool's transaction gives its
// connection back inside Commit, before [Commit] looks at what the COMMIT
// said: the next holder may already use the connection. So each COMMIT
// brings a record of its own, the handler writes into whichever record is
// current, and all of it is under a lock.
type watch struct {
	mu     sync.Mutex
	commit *commitRecord // the COMMIT in progress, or nil
	probed bool
}

// commitRecord is what one COMMIT was told.
type commitRecord struct {
	warning *pgconn.Notice // the first warning seen
}

func (w *watch) notice(n *pgconn.Notice) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case n.Message == probeMessage:
		w.probed = true
	case w.commit != nil && w.commit.warning == nil && isWarning(n):
		w.commit.warning = n
	}
}

// isWarning reports a WARNING-severity notice (SQLSTATE class 01). The
// cancelled wait for the synchronous standby comes as 01000 with a
// message in the server's language; any warning during a COMMIT makes its
// outcome unknown rather than trusting a match on translated text.
func isWarning(n *pgconn.Notice) bool {
	return strings.HasPrefix(n.Code, "01") || n.SeverityUnlocalized == "WARNING"
}

// Install chains the watch onto cfg: its OnNotice handler records
// warnings for [Commit] and then calls the handler cfg had; its
// AfterConnect marks each new connection as watched and then calls the
// hook cfg had. Call it before the pool or connection is made:
//
//	cfg, _ := pgxpool.ParseConfig(url)
//	pgwatch.Install(cfg.ConnConfig)
//	pool, _ := pgxpool.NewWithConfig(ctx, cfg)
//
// An OnNotice set on cfg after Install must call the one it replaces, or
// the connections are no longer watched ([Check] finds out).
func Install(cfg *pgx.ConnConfig) {
	prevNotice := cfg.OnNotice
	cfg.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if w, ok := c.CustomData()[key].(*watch); ok {
			w.notice(n)
		}
		if prevNotice != nil {
			prevNotice(c, n)
		}
	}
	prevAfter := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		if _, ok := c.CustomData()[key]; !ok {
			c.CustomData()[key] = &watch{}
		}
		if prevAfter != nil {
			return prevAfter(ctx, c)
		}
		return nil
	}
}

// Watched reports whether tx runs on a connection made with [Install].
func Watched(tx pgx.Tx) bool {
	_, ok := watchOf(tx)
	return ok
}

func watchOf(tx pgx.Tx) (*watch, bool) {
	c := tx.Conn()
	if c == nil || c.PgConn() == nil {
		return nil, false
	}
	w, ok := c.PgConn().CustomData()[key].(*watch)
	return w, ok
}

// Commit commits tx. If the server answers with success and a warning
// (the wait for the synchronous standby was cancelled), it returns an
// error wrapping [ErrNotReplicated] and the warning's text: not a
// *pgconn.PgError, as the transaction did commit here. On a connection
// not made with [Install] it cannot see the warning and is tx.Commit.
func Commit(ctx context.Context, tx pgx.Tx) error {
	w, ok := watchOf(tx)
	if !ok {
		return tx.Commit(ctx)
	}
	rec := &commitRecord{}
	w.mu.Lock()
	w.commit = rec
	w.mu.Unlock()
	err := tx.Commit(ctx)
	// Every notice of this COMMIT came before tx.Commit returned. A
	// transaction of a pool has given the connection back by now, so
	// another holder may have begun its own COMMIT (then w.commit is
	// its record, left alone) or a statement whose warning landed in rec
	// meanwhile: that makes this outcome unknown, the safe side.
	w.mu.Lock()
	if w.commit == rec {
		w.commit = nil
	}
	warning := rec.warning
	w.mu.Unlock()
	if err != nil {
		return err
	}
	if warning != nil {
		return fmt.Errorf("%w: server said %s %s: %s", ErrNotReplicated, warning.Severity, warning.Code, warning.Message)
	}
	return nil
}

// DB is what [Check] needs of a database: a pool or a connection.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Check reports an error wrapping [ErrUnwatched] unless db's connections
// were made with [Install] and their notice handler is still in place:
// it raises a warning of its own in a transaction it rolls back and looks
// for it. A pool's connections share one configuration, so one
// connection answers for all of them.
func Check(ctx context.Context, db DB) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("commit watch: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	w, ok := watchOf(tx)
	if !ok {
		return ErrUnwatched
	}
	w.mu.Lock()
	w.probed = false
	w.mu.Unlock()
	// The simple protocol: no prepared statement, behind a pooler too.
	if _, err := tx.Exec(ctx, `DO $$BEGIN RAISE WARNING '`+probeMessage+`'; END$$`, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("commit watch: probe: %w", err)
	}
	w.mu.Lock()
	probed := w.probed
	w.mu.Unlock()
	if !probed {
		return fmt.Errorf("%w (a notice handler set after the watch dropped it)", ErrUnwatched)
	}
	return nil
}

// ReadPriorCommits writes an empty transactional logical-decoding message
// (prefix "jetinbox.durable", seen only by logical decoding consumers) in
// tx, so that its COMMIT writes a record, flushes and waits for the
// synchronous standby to confirm all WAL before it, as a writing
// transaction's does. A transaction ID alone does not do it: PostgreSQL
// commits a transaction that wrote no WAL without flushing or waiting.
// Whatever rests on an earlier commit (a duplicate's ack, a replayed
// answer, a resumed fence) calls it before its own COMMIT.
func ReadPriorCommits(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'jetinbox.durable', '')`)
	return err
}
