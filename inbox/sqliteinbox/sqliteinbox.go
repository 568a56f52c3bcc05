// Package sqliteinbox keeps the inbox in a SQLite file: an [driver.Store]
// for a worker where one small process and a local file will do, behind
// the same guarantee and the same conformance suite as PostgreSQL. The
// driver is modernc.org/sqlite, pure Go: nothing needs cgo.
//
// The guarantee rests on three settings, which [Open] makes and
// [CheckSettings] verifies:
//
//   - WAL with synchronous=FULL: a batch is acked after its COMMIT
//     returns, so the commit must be on disk by then. synchronous=NORMAL
//     can lose the last commits on power loss after they were acked.
//   - BEGIN IMMEDIATE: each batch's transaction takes the write lock
//     first, so two processes on one file take turns and never both see
//     an ID unclaimed.
//   - busy_timeout: the process that waits for the lock waits instead of
//     failing at once; a wait past it retries the batch.
//
// One file has one writer at a time: [Open] gives a pool of one
// connection, so the batches of a process queue in Go rather than in
// SQLite's busy loop. Handlers must not use the *sql.DB while they run
// inside a batch's transaction.
package sqliteinbox

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations are the embedded migrations, read once.
var migrations = migrate.Embedded(migrationFS, "migrations")

// BusyTimeout is how long a transaction waits for the write lock another
// connection holds before its batch is retried.
const BusyTimeout = 10 * time.Second

// Open opens the SQLite database file at path, creating it if it does not
// exist, with the settings the guarantee needs: WAL, synchronous=FULL,
// busy_timeout, transactions that begin IMMEDIATE, one connection. It checks
// them before returning. The write-ahead log is copied back into the file
// by checkpoints on a second connection, every [CheckpointInterval], not
// inside the COMMIT of a batch; closing the returned pool stops them.
func Open(ctx context.Context, path string) (*sql.DB, error) {
	if path == "" {
		return nil, errors.New("sqliteinbox: empty database path")
	}
	if strings.HasPrefix(path, "file:") || strings.Contains(path, ":memory:") {
		return nil, fmt.Errorf("sqliteinbox: %q: give a file path (an in-memory database does not survive a crash)", path)
	}
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + DSNParams()
	db, err := openWithCheckpoints(sqlite.NewConnector, dsn)
	if err != nil {
		return nil, fmt.Errorf("sqliteinbox: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if err := CheckSettings(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return db, nil
}

// DSNParams are the connection parameters [Open] gives the modernc.org/sqlite
// driver, for callers that open the file themselves.
func DSNParams() string {
	return fmt.Sprintf("_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate",
		BusyTimeout.Milliseconds())
}

// ErrUnsafeSettings is returned by [CheckSettings] for a connection whose
// settings could lose an acked commit or let two writers interleave.
var ErrUnsafeSettings = errors.New("sqliteinbox: unsafe SQLite settings")

// CheckSettings reports [ErrUnsafeSettings] unless db's connection runs in
// WAL mode with synchronous=FULL (or EXTRA), waits for locks, and begins
// its transactions IMMEDIATE.
func CheckSettings(ctx context.Context, db *sql.DB) error {
	var mode string
	var syncLevel, busy int
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("sqliteinbox: %w", err)
	}
	if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&syncLevel); err != nil {
		return fmt.Errorf("sqliteinbox: %w", err)
	}
	if err := db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil {
		return fmt.Errorf("sqliteinbox: %w", err)
	}
	switch {
	case !strings.EqualFold(mode, "wal"):
		return fmt.Errorf("%w: journal_mode is %s, want wal", ErrUnsafeSettings, mode)
	case syncLevel < 2: // 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA
		return fmt.Errorf("%w: synchronous is %d, want 2 (FULL): an acked commit could be lost on power loss", ErrUnsafeSettings, syncLevel)
	case busy <= 0:
		return fmt.Errorf("%w: busy_timeout is 0: a second writer would fail at once", ErrUnsafeSettings)
	}
	// A transaction that begins IMMEDIATE holds the write lock: a second
	// connection cannot write until it ends.
	if immediate, err := beginsImmediate(ctx, db); err != nil {
		return err
	} else if !immediate {
		return fmt.Errorf("%w: transactions begin DEFERRED, want IMMEDIATE (_txlock=immediate)", ErrUnsafeSettings)
	}
	return nil
}

// beginsImmediate reports whether db's transactions take the write lock at
// BEGIN: while one of them, empty yet, is open, a second connection to the
// same file that does not wait must fail to take the lock.
func beginsImmediate(ctx context.Context, db *sql.DB) (bool, error) {
	var seq int
	var name, file string
	if err := db.QueryRowContext(ctx, "PRAGMA database_list").Scan(&seq, &name, &file); err != nil {
		return false, fmt.Errorf("sqliteinbox: %w", err)
	}
	probe, err := sql.Open("sqlite", "file:"+(&url.URL{Path: file}).EscapedPath()+"?_pragma=busy_timeout(0)")
	if err != nil {
		return false, fmt.Errorf("sqliteinbox: %w", err)
	}
	defer probe.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("sqliteinbox: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // nothing was written
	_, err = probe.ExecContext(ctx, "BEGIN IMMEDIATE; ROLLBACK")
	if err == nil {
		return false, nil
	}
	if Classify(err) == driver.ErrorRetryTx {
		return true, nil
	}
	return false, fmt.Errorf("sqliteinbox: probe the lock: %w", err)
}

// IsConfigError reports whether err says the file itself is unusable as
// given, which no retry can change: unsafe settings, a path that cannot be
// opened, a file that is not a database, no permission, a read-only file.
func IsConfigError(err error) bool {
	if errors.Is(err, ErrUnsafeSettings) {
		return true
	}
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_PERM, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_AUTH:
		return true
	}
	return false
}

// Store is the SQLite inbox: the [driver.Store] a processor runs on
// (handlers get the batch's *sql.Tx), and the schema, retention and health
// checks of the same file. Make one with [New] on a database [Open] opened.
//
// Its methods Begin, Commit, Rollback, CommitRolledBack, Claim,
// ClaimNewThreshold, ClaimNew, Savepoint, MarkRejected, ReleaseClaims,
// RecordConflicts, Classify and Warm are the driver.Store seam the
// processor calls; they are not for users. What a user calls: New,
// Migrate, MigrationSQL, MigrationStatus, CheckSchema, Check, Ping, Prune.
type Store struct {
	db *sql.DB
	// claim is ClaimTx; tests plant a broken one (export_test.go).
	claim func(ctx context.Context, tx *sql.Tx, scope string, claims []driver.Claim) ([]driver.ClaimResult, error)
}

var _ driver.Store[*sql.Tx] = (*Store)(nil)

// New returns the store on db, which [Open] opened.
func New(db *sql.DB) *Store { return &Store{db: db, claim: ClaimTx} }

// DB returns the database the store runs on.
func (s *Store) DB() *sql.DB { return s.db }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// Begin implements [driver.Store]: BEGIN IMMEDIATE, waiting up to
// [BusyTimeout] for another connection's write lock.
func (s *Store) Begin(ctx context.Context) (*sql.Tx, error) { return s.db.BeginTx(ctx, nil) }

// Commit implements [driver.Store].
func (s *Store) Commit(_ context.Context, tx *sql.Tx) error { return tx.Commit() }

// Rollback implements [driver.Store].
func (s *Store) Rollback(_ context.Context, tx *sql.Tx) error {
	err := tx.Rollback()
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// CommitRolledBack implements [driver.Store]: only a transaction that
// database/sql had already ended (its context was cancelled) certainly did
// not commit; any other failed COMMIT is an unknown outcome.
func (s *Store) CommitRolledBack(err error) bool { return errors.Is(err, sql.ErrTxDone) }

// ClaimNewThreshold implements [driver.Store]: SQLite has no fast path; a
// claim is one in-process statement per message already.
func (s *Store) ClaimNewThreshold() int { return 0 }

// ClaimNew implements [driver.Store]; it is never called (no fast path).
func (s *Store) ClaimNew(context.Context, *sql.Tx, string, []driver.Claim, []int) error {
	return errors.ErrUnsupported
}

// Claim implements [driver.Store] with [ClaimTx].
func (s *Store) Claim(ctx context.Context, tx *sql.Tx, scope string, claims []driver.Claim) ([]driver.ClaimResult, error) {
	return s.claim(ctx, tx, scope, claims)
}

// Savepoint implements [driver.Store].
func (s *Store) Savepoint(ctx context.Context, tx *sql.Tx, stmt string) error {
	_, err := tx.ExecContext(ctx, stmt)
	return err
}

// MarkRejected implements [driver.Store].
func (s *Store) MarkRejected(ctx context.Context, tx *sql.Tx, scope string, ids, reasons []string) error {
	st, err := tx.PrepareContext(ctx, `UPDATE inbox SET status = 'rejected', reason = ? WHERE scope = ? AND message_id = ?`)
	if err != nil {
		return err
	}
	defer st.Close()
	for k, id := range ids {
		if _, err := st.ExecContext(ctx, reasons[k], scope, id); err != nil {
			return err
		}
	}
	return nil
}

// ReleaseClaims implements [driver.Store].
func (s *Store) ReleaseClaims(ctx context.Context, tx *sql.Tx, scope string, ids []string) error {
	st, err := tx.PrepareContext(ctx, `DELETE FROM inbox WHERE scope = ? AND message_id = ?`)
	if err != nil {
		return err
	}
	defer st.Close()
	var n int64
	for _, id := range ids {
		r, err := st.ExecContext(ctx, scope, id)
		if err != nil {
			return err
		}
		k, err := r.RowsAffected()
		if err != nil {
			return err
		}
		n += k
	}
	if n != int64(len(ids)) {
		// A row left behind would make the redelivery a duplicate, acked
		// without its effect: fail the batch instead.
		return fmt.Errorf("released %d of %d", n, len(ids))
	}
	return nil
}

// RecordConflicts implements [driver.Store].
func (s *Store) RecordConflicts(ctx context.Context, tx *sql.Tx, scope string, conflicts []driver.Claim) error {
	st, err := tx.PrepareContext(ctx, `INSERT INTO inbox_conflicts (scope, message_id, fingerprint, stream_seq, subject)
VALUES (?, ?, ?, ?, ?) ON CONFLICT (scope, message_id, stream_seq) DO NOTHING`)
	if err != nil {
		return err
	}
	defer st.Close()
	for _, c := range conflicts {
		if _, err := st.ExecContext(ctx, scope, c.ID, c.Fingerprint[:], int64(c.StreamSeq), c.Subject); err != nil {
			return err
		}
	}
	return nil
}

// Classify implements [driver.Store]: a lock that stayed busy retries the
// batch; constraint, type and size errors are the input's; I/O, a full disk,
// a corrupt or read-only file and a closed handle are the database's.
func (s *Store) Classify(err error) driver.ErrorKind { return Classify(err) }

// Classify says what a SQLite error means for a batch; see [driver.ErrorKind].
func Classify(err error) driver.ErrorKind {
	if errors.Is(err, sql.ErrConnDone) || errors.Is(err, sql.ErrTxDone) {
		return driver.ErrorConn
	}
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return driver.ErrorOther
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return driver.ErrorRetryTx
	case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_RANGE:
		return driver.ErrorData
	case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN,
		sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_NOMEM:
		return driver.ErrorConn
	}
	return driver.ErrorOther
}

// Warm implements [driver.Store]: one file has one writer, so it readies
// one transaction whatever n is.
func (s *Store) Warm(ctx context.Context, _ int, prepare func(ctx context.Context, tx *sql.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("inbox: warm: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // nothing was written
	return prepare(ctx, tx)
}

// Outbox returns the outbox store in the same file: its Migrate,
// CheckSchema, Prune and Backlog, and the source a relay takes rows from
// (outbox.NewRelay(st.Outbox(), js, cfg)). Its table is migrated apart from
// the inbox's, by its own Migrate: a worker that emits nothing needs no
// outbox table.
func (s *Store) Outbox() *sqliteoutbox.Store { return sqliteoutbox.New(s.db) }
