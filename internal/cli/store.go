package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/delivery/sqlitedelivery"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

// The stores a database URL can name.
const (
	StorePostgres = "postgres"
	StoreSQLite   = "sqlite"
)

// SQLitePath returns the file a sqlite:// URL names (sqlite:///var/lib/x.db
// is /var/lib/x.db, sqlite://x.db is x.db in the working directory), and
// false for any other URL.
func SQLitePath(dbURL string) (string, bool, error) {
	rest, ok := strings.CutPrefix(dbURL, "sqlite://")
	if !ok {
		rest, ok = strings.CutPrefix(dbURL, "sqlite:")
		if !ok {
			return "", false, nil
		}
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		return "", true, fmt.Errorf("%q: a SQLite URL takes no parameters: the settings the guarantee needs are fixed", dbURL)
	}
	p, err := url.PathUnescape(rest)
	if err != nil {
		return "", true, fmt.Errorf("%q: %w", dbURL, err)
	}
	if p == "" || p == "/" {
		return "", true, fmt.Errorf("%q names no file: write sqlite:///path/to/file.db", dbURL)
	}
	return p, true, nil
}

// StoreKind returns which store dbURL names: [StoreSQLite] for sqlite://
// URLs, [StorePostgres] for anything else.
func StoreKind(dbURL string) string {
	if _, ok, _ := SQLitePath(dbURL); ok {
		return StoreSQLite
	}
	return StorePostgres
}

// Store is the inbox database a command runs on: a PostgreSQL pool or a
// SQLite file, chosen by the database URL.
type Store struct {
	// PG is the pool on PostgreSQL; nil on SQLite.
	PG *pgxpool.Pool
	// SQLite is the handle on the SQLite file; nil on PostgreSQL.
	SQLite *sql.DB
	// Path is the SQLite file.
	Path string
	// Pooled reports that a connection pooler answers for the PostgreSQL
	// server ([BehindPooler]): the pool runs without named prepared
	// statements, and a relay cannot LISTEN on it.
	Pooled bool
	// Deliveries, if set, routes the subjects of applied messages to
	// delivery endpoints: the ledger processor adds a delivery row per
	// matched endpoint in the inbox transaction (consumer -deliveries).
	Deliveries delivery.Routes

	// listen is the pool a relay LISTENs on, when not PG (see
	// [Store.OpenListen]).
	listen *pgxpool.Pool
}

// OpenStore opens the database dbURL names: a SQLite file for
// sqlite:///path (see [SQLitePath]), else a PostgreSQL pool of maxConns
// ([OpenDB]).
func OpenStore(ctx context.Context, dbURL string, maxConns int32, log *slog.Logger) (*Store, error) {
	path, ok, err := SQLitePath(dbURL)
	if err != nil {
		return nil, UsageError{Err: fmt.Errorf("DATABASE_URL: %w", err)}
	}
	if ok {
		db, err := sqliteinbox.Open(ctx, path)
		if err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
		return &Store{SQLite: db, Path: path}, nil
	}
	pool, pooled, err := openDB(ctx, dbURL, maxConns, log)
	if err != nil {
		return nil, err
	}
	return &Store{PG: pool, Pooled: pooled}, nil
}

// UnsafeSQLiteSynchronousEnv names the environment variable that makes the
// consumer open its SQLite file with synchronous=NORMAL, which the
// guarantee forbids: in WAL mode a commit then returns before it is on
// disk, and a power loss can take commits whose messages were already
// acked. It exists so that the power-loss chaos run can show what that
// setting loses; the only value it takes is NORMAL, it is honoured only
// when set, only by the consumer, only for a sqlite:// URL, and logged as
// an error-level warning at start. Never set it in production.
const UnsafeSQLiteSynchronousEnv = "JETINBOX_UNSAFE_SQLITE_SYNCHRONOUS"

// openSQLiteUnsafeNormal opens the file dbURL names as [OpenStore] does,
// but with synchronous=NORMAL (see [UnsafeSQLiteSynchronousEnv]), and
// checks that the connection really runs with it.
func openSQLiteUnsafeNormal(ctx context.Context, dbURL string) (*Store, error) {
	path, ok, err := SQLitePath(dbURL)
	if err != nil || !ok {
		return nil, UsageError{Err: fmt.Errorf("%s is set but DATABASE_URL names no SQLite file: %v", UnsafeSQLiteSynchronousEnv, err)}
	}
	params := strings.Replace(sqliteinbox.DSNParams(), "synchronous(FULL)", "synchronous(NORMAL)", 1)
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?"+params)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	var level int
	if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&level); err != nil {
		db.Close()
		return nil, fmt.Errorf("database: %w", err)
	}
	if level != 1 {
		db.Close()
		return nil, fmt.Errorf("database: synchronous is %d after asking for NORMAL (1)", level)
	}
	return &Store{SQLite: db, Path: path}, nil
}

// ListenDatabaseUsage is the help text of the flags that take a relay's
// direct URL for LISTEN.
const ListenDatabaseUsage = "a direct PostgreSQL URL (same database, no connection pooler) for the relay's LISTEN, when the database URL reaches the server " +
	"through a pooler in transaction mode, which cannot carry notifications (env JETINBOX_LISTEN_DATABASE_URL)"

// OpenListen opens a pool of one connection on dbURL for a relay on this
// PostgreSQL store to LISTEN on, in place of the store's own pool. dbURL
// must reach the same database without a connection pooler.
func (s *Store) OpenListen(ctx context.Context, dbURL string, log *slog.Logger) error {
	if s.PG == nil {
		return UsageError{Err: errors.New("a LISTEN database URL is for a PostgreSQL store: SQLite has no notifications")}
	}
	if _, ok, _ := SQLitePath(dbURL); ok {
		return UsageError{Err: fmt.Errorf("JETINBOX_LISTEN_DATABASE_URL: %s is not a PostgreSQL URL", dbURL)}
	}
	pool, pooled, err := openDB(ctx, dbURL, 1, log)
	if err != nil {
		return fmt.Errorf("JETINBOX_LISTEN_DATABASE_URL: %w", err)
	}
	if pooled {
		pool.Close()
		return UsageError{Err: errors.New("JETINBOX_LISTEN_DATABASE_URL: a connection pooler answers there too; LISTEN needs a direct connection to the server")}
	}
	s.listen = pool
	return nil
}

// ReleaseRejected deletes the inbox row of id in scope if it records a
// rejection, so that the intent, published again, is decided again (a
// re-drive after the cause was fixed). It returns the status the row had,
// "" if there was none; an applied row stays as it is.
func (s *Store) ReleaseRejected(ctx context.Context, scope, id string) (driver.RowStatus, error) {
	var status string
	if s.SQLite == nil {
		err := s.PG.QueryRow(ctx, `WITH del AS (
	DELETE FROM inbox WHERE scope = $1 AND message_id = $2 AND status = 'rejected' RETURNING status
) SELECT coalesce((SELECT status FROM del), (SELECT status FROM inbox WHERE scope = $1 AND message_id = $2), '')`, scope, id).Scan(&status)
		return driver.RowStatus(status), err
	}
	tx, err := s.SQLite.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback() }()
	err = tx.QueryRowContext(ctx, `SELECT status FROM inbox WHERE scope = ? AND message_id = ?`, scope, id).Scan(&status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", nil
	case err != nil:
		return "", err
	}
	if driver.RowStatus(status) == driver.RowRejected {
		if _, err := tx.ExecContext(ctx, `DELETE FROM inbox WHERE scope = ? AND message_id = ? AND status = 'rejected'`, scope, id); err != nil {
			return "", err
		}
	}
	return driver.RowStatus(status), tx.Commit()
}

// Kind is [StorePostgres] or [StoreSQLite].
func (s *Store) Kind() string {
	if s.SQLite != nil {
		return StoreSQLite
	}
	return StorePostgres
}

// String names the store for logs: the SQLite file, or PostgreSQL.
func (s *Store) String() string {
	if s.SQLite != nil {
		return "SQLite " + s.Path
	}
	return "PostgreSQL"
}

// Close closes the pool or the file.
func (s *Store) Close() {
	if s.SQLite != nil {
		_ = s.SQLite.Close()
		return
	}
	s.PG.Close()
	if s.listen != nil {
		s.listen.Close()
	}
}

// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if s.SQLite != nil {
		return s.SQLite.PingContext(ctx)
	}
	return s.PG.Ping(ctx)
}

// CheckSchema reports [inbox.ErrNotMigrated] unless the inbox schema is
// up to date; on PostgreSQL it also checks that the session can write and
// hold a transaction ([pginbox.Store.CheckSession]) and that the pool sees
// commits the synchronous standby never confirmed
// ([pginbox.Store.CheckCommitWatch]).
func (s *Store) CheckSchema(ctx context.Context) error {
	if s.SQLite != nil {
		return sqliteinbox.New(s.SQLite).CheckSchema(ctx)
	}
	st := pginbox.New(s.PG)
	if err := st.CheckSchema(ctx); err != nil {
		return err
	}
	// The watch's probe runs in a transaction: a session that cannot
	// hold one (a statement pooler) is refused first, saying so.
	if err := st.CheckSession(ctx); err != nil {
		return err
	}
	return st.CheckCommitWatch(ctx)
}

// CheckWritable reports a database that answers but cannot take the
// transactions a writing command runs, wrapping [inbox.ErrDatabaseUnfit]
// (exit 2): on PostgreSQL a read-only session (a standby, a database or
// role set default_transaction_read_only) or a connection that cannot hold
// a transaction (a pooler in statement mode); on SQLite a query-only
// connection.
func (s *Store) CheckWritable(ctx context.Context) error {
	if s.SQLite != nil {
		var queryOnly int
		if err := s.SQLite.QueryRowContext(ctx, "PRAGMA query_only").Scan(&queryOnly); err != nil {
			return fmt.Errorf("database: %w", err)
		}
		if queryOnly != 0 {
			return fmt.Errorf("%w: the connection is query-only (PRAGMA query_only)", inbox.ErrDatabaseUnfit)
		}
		return nil
	}
	return pginbox.New(s.PG).CheckSession(ctx)
}

// Migrate applies the inbox and ledger schemas and returns how many
// migrations of each it applied.
func (s *Store) Migrate(ctx context.Context) (inboxN, ledgerN int, err error) {
	if s.SQLite != nil {
		if inboxN, err = sqliteinbox.New(s.SQLite).Migrate(ctx); err != nil {
			return inboxN, 0, err
		}
		ledgerN, err = effects.MigrateSQLite(ctx, s.SQLite)
		return inboxN, ledgerN, err
	}
	if inboxN, err = pginbox.New(s.PG).Migrate(ctx); err != nil {
		return inboxN, 0, err
	}
	ledgerN, err = effects.Migrate(ctx, s.PG)
	return inboxN, ledgerN, err
}

// MigrationStatus compares the inbox and ledger migrations with what the
// database recorded.
func (s *Store) MigrationStatus(ctx context.Context) (in, ledger []inbox.MigrationState, err error) {
	if s.SQLite != nil {
		if in, err = sqliteinbox.New(s.SQLite).MigrationStatus(ctx); err != nil {
			return nil, nil, err
		}
		ledger, err = effects.MigrationStatusSQLite(ctx, s.SQLite)
		return in, ledger, err
	}
	if in, err = pginbox.New(s.PG).MigrationStatus(ctx); err != nil {
		return nil, nil, err
	}
	ledger, err = effects.MigrationStatus(ctx, s.PG)
	return in, ledger, err
}

// SeedAccounts makes sure accounts 1..n exist.
func (s *Store) SeedAccounts(ctx context.Context, n int) error {
	if s.SQLite != nil {
		return effects.SeedAccountsSQLite(ctx, s.SQLite, n)
	}
	return effects.SeedAccounts(ctx, s.PG, n)
}

// Prune deletes old inbox rows; see [inbox.PruneOptions].
func (s *Store) Prune(ctx context.Context, opts inbox.PruneOptions) (int64, error) {
	if s.SQLite != nil {
		return sqliteinbox.New(s.SQLite).Prune(ctx, opts)
	}
	return pginbox.New(s.PG).Prune(ctx, opts)
}

// LedgerProcessor returns the ledger's processor on this store, with the
// inbox scope and the ledger scope one and the same, cfg.Scope (see
// [NewLedgerProcessor]).
func (s *Store) LedgerProcessor(cfg inbox.Config) (jsinbox.BatchProcessor, error) {
	return s.ledgerProcessor(cfg, false, "")
}

// FollowUpLedgerProcessor is [Store.LedgerProcessor] whose ledger adds a
// follow-up per applied credit, on subject prefix followUps, to this
// store's outbox in the inbox transaction (effects.Ledger.WithFollowUps,
// effects.SQLiteLedger.WithFollowUps).
func (s *Store) FollowUpLedgerProcessor(cfg inbox.Config, followUps string) (jsinbox.BatchProcessor, error) {
	return s.ledgerProcessor(cfg, false, followUps)
}

// DryRunLedgerProcessor is [Store.LedgerProcessor] whose commits roll
// back: a dry run takes the processor's whole path (claims, effects,
// rejections, conflicts) and leaves nothing behind.
func (s *Store) DryRunLedgerProcessor(cfg inbox.Config) (jsinbox.BatchProcessor, error) {
	return s.ledgerProcessor(cfg, true, "")
}

func (s *Store) ledgerProcessor(cfg inbox.Config, dryRun bool, followUps string) (jsinbox.BatchProcessor, error) {
	if s.SQLite == nil {
		l, err := effects.NewScopedLedger(cfg.Scope)
		if err != nil {
			return nil, err
		}
		if followUps != "" {
			if l, err = l.WithFollowUps(effects.FollowUps{Subject: followUps}); err != nil {
				return nil, err
			}
		}
		var st driver.Store[pgx.Tx] = pginbox.New(s.PG)
		if dryRun {
			st = rollbackStore[pgx.Tx]{st}
		}
		if s.Deliveries != nil {
			return inbox.NewProcessor(st, pgdelivery.Routed(l, s.Deliveries), cfg)
		}
		return inbox.NewProcessor(st, l, cfg)
	}
	l, err := effects.NewScopedSQLiteLedger(cfg.Scope)
	if err != nil {
		return nil, err
	}
	if followUps != "" {
		if l, err = l.WithFollowUps(effects.FollowUps{Subject: followUps}); err != nil {
			return nil, err
		}
	}
	var st driver.Store[*sql.Tx] = sqliteinbox.New(s.SQLite)
	if dryRun {
		st = rollbackStore[*sql.Tx]{st}
	}
	if s.Deliveries != nil {
		return inbox.NewProcessor(st, sqlitedelivery.Routed(l, s.Deliveries), cfg)
	}
	return inbox.NewProcessor(st, l, cfg)
}

// rollbackStore is a store whose Commit rolls back.
type rollbackStore[TX any] struct{ driver.Store[TX] }

// Commit rolls tx back.
func (s rollbackStore[TX]) Commit(ctx context.Context, tx TX) error { return s.Rollback(ctx, tx) }

// HasRows reports whether the inbox holds any row of scope.
func (s *Store) HasRows(ctx context.Context, scope string) (bool, error) {
	var some bool
	var err error
	if s.SQLite != nil {
		err = s.SQLite.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM inbox WHERE scope = ?)`, scope).Scan(&some)
	} else {
		err = s.PG.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM inbox WHERE scope = $1)`, scope).Scan(&some)
	}
	if err != nil {
		return false, fmt.Errorf("inbox: %w", err)
	}
	return some, nil
}

// OutboxStore is what the tools do with either backend's outbox store
// (*pgoutbox.Store, *sqliteoutbox.Store): migrate it, check it, prune it,
// count its backlog and relay from it.
type OutboxStore interface {
	outbox.Source
	Migrate(ctx context.Context) (int, error)
	MigrationSQL() string
	MigrationStatus(ctx context.Context) ([]inbox.MigrationState, error)
	CheckSchema(ctx context.Context) error
	Prune(ctx context.Context, opts outbox.PruneOptions) (int64, error)
	Backlog(ctx context.Context) (int64, time.Duration, error)
}

// Outbox returns the outbox store in the same database; on PostgreSQL its
// relay LISTENs on the pool of OpenListen, if one was opened.
func (s *Store) Outbox() OutboxStore {
	if s.SQLite != nil {
		return sqliteoutbox.New(s.SQLite)
	}
	o := pgoutbox.New(s.PG)
	if s.listen != nil {
		o = o.WithListen(s.listen)
	}
	return o
}
