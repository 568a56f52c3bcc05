package pgoutbox

import (
	"context"
	"embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/internal/pgmigrate"
	"github.com/jetinbox/jetinbox/outbox"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations are the embedded migrations, read once.
var migrations = migrate.Embedded(migrationFS, "migrations")

// DB is the database a [Store] runs on. *pgxpool.Pool and *pgx.Conn
// satisfy it (so does pginbox.DB, which [Store] is made from by
// pginbox.Store.Outbox); a relay wants a pool, so that its LISTEN has a
// connection of its own.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Store is the outbox in PostgreSQL: its schema, retention and backlog, and
// the [outbox.Source] a relay takes rows from ([outbox.NewRelay] takes the
// Store itself). Rows are added with [Add] and [AddFresh] in the caller's
// own transaction, not through the Store.
//
// A relay locks a batch with SELECT … FOR UPDATE SKIP LOCKED in a
// transaction that stays open until the batch is marked, so the locks of a
// relay that dies end with its connection; the Store is an
// [outbox.Listener] too (LISTEN on [outbox.Channel]).
type Store struct {
	db DB
	// listen, if set, is the pool LISTEN runs on instead of db's
	// (see [Store.WithListen]).
	listen *pgxpool.Pool
}

// New returns the outbox store on db, a *pgxpool.Pool or a *pgx.Conn.
func New(db DB) *Store { return &Store{db: db} }

// WithListen returns a copy of s whose relay LISTENs on a connection of
// pool rather than of s's database: for a database reached through a
// pooler in transaction mode, where a LISTEN is forgotten with the server
// connection it happened to run on, pool connects to the server directly.
func (s *Store) WithListen(pool *pgxpool.Pool) *Store {
	c := *s
	c.listen = pool
	return &c
}

// Migrate creates or upgrades the outbox table, recording applied versions
// in jetinbox_migrations under [outbox.Component]. It is safe to call
// concurrently and repeatedly, and returns how many migrations it applied.
// `jetinbox migrate` calls it.
func (s *Store) Migrate(ctx context.Context) (int, error) {
	return pgmigrate.Apply(ctx, s.db, outbox.Component, migrations())
}

// MigrationSQL returns the outbox schema as one SQL script, for people who
// run their own migration tool. It does not touch the database.
func (s *Store) MigrationSQL() string { return migrate.Script(outbox.Component, migrations()) }

// MigrationStatus compares the outbox migrations this package ships with
// what the database recorded.
func (s *Store) MigrationStatus(ctx context.Context) ([]inbox.MigrationState, error) {
	return pgmigrate.Status(ctx, s.db, outbox.Component, migrations())
}

// CheckSchema reports [outbox.ErrNotMigrated] unless every outbox migration
// this package ships has been applied. `jetinbox relay` calls it at start.
func (s *Store) CheckSchema(ctx context.Context) error {
	return pgmigrate.Check(ctx, s.db, outbox.Component, migrations(), outbox.ErrNotMigrated)
}

// Prune deletes sent outbox rows created longer than opts.OlderThan ago
// (by PostgreSQL's clock), in batches, and returns how many it deleted.
// Pending rows and rows marked failed are never deleted. It returns an
// error wrapping [inbox.ErrUnsafeHorizon], deleting nothing, unless
// OlderThan is strictly longer than ReplayHorizon + Margin (see
// [outbox.PruneOptions.Checked]).
func (s *Store) Prune(ctx context.Context, opts outbox.PruneOptions) (int64, error) {
	opts, err := opts.Checked()
	if err != nil {
		return 0, err
	}
	var cutoff time.Time
	if err := queryRow(ctx, s.db, `SELECT now() - $1::bigint * interval '1 microsecond'`, []any{opts.OlderThan.Microseconds()}, &cutoff); err != nil {
		return 0, fmt.Errorf("outbox: prune: cut-off: %w", err)
	}
	var total int64
	for {
		tag, err := s.db.Exec(ctx, `DELETE FROM outbox WHERE ctid = ANY (ARRAY (
	SELECT ctid FROM outbox WHERE created_at < $1 AND sent_at IS NOT NULL LIMIT $2))`, cutoff, opts.BatchSize)
		if err != nil {
			return total, fmt.Errorf("outbox: prune: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(opts.BatchSize) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// Backlog returns how many rows wait to be published and how long the
// oldest has waited, by PostgreSQL's clock: for metrics and alerts.
func (s *Store) Backlog(ctx context.Context) (int64, time.Duration, error) {
	var n int64
	var oldest float64
	if err := queryRow(ctx, s.db, `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM outbox WHERE sent_at IS NULL AND failed IS NULL`, nil, &n, &oldest); err != nil {
		return 0, 0, fmt.Errorf("outbox: backlog: %w", err)
	}
	return n, time.Duration(oldest * float64(time.Second)), nil
}

// queryRow runs a query that returns one row through a [Querier] and
// scans it into dest.
func queryRow(ctx context.Context, db Querier, sql string, args []any, dest ...any) error {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

var (
	_ outbox.Source   = (*Store)(nil)
	_ outbox.Listener = (*Store)(nil)
)
