// Package pgidempotency keeps the keys of package idempotency in
// PostgreSQL: the key's row is claimed, and its answer stored, in the
// pgx.Tx the route's handler does its work in.
//
// A duplicate's claim blocks on the unique index until the transaction
// holding the key ends: if it committed, the duplicate reads its answer
// (a new statement under READ COMMITTED sees it); if it rolled back, the
// duplicate's insert goes through and it runs. The wait is bounded with a
// transaction-local lock_timeout; past it the claim returns an error
// wrapping idempotency.ErrBusy (the handler answers 409). A process that
// dies while holding a key holds nothing: its transaction ends with its
// connection.
package pgidempotency

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/internal/pgmigrate"
	"github.com/jetinbox/jetinbox/internal/pgwatch"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

var migrations = migrate.Embedded(migrationFS, "migrations")

// DB is the database a [Store] runs on: *pgxpool.Pool (or *pgx.Conn for a
// single request at a time).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store is the key table in PostgreSQL; it implements
// idempotency.Store[pgx.Tx].
type Store struct{ db DB }

// New returns the store on db.
func New(db DB) *Store { return &Store{db: db} }

var _ idempotency.Store[pgx.Tx] = (*Store)(nil)

// Migrate creates or upgrades the key table, recording versions in
// jetinbox_migrations under idempotency.Component.
func (s *Store) Migrate(ctx context.Context) (int, error) {
	return pgmigrate.Apply(ctx, s.db, idempotency.Component, migrations())
}

// MigrationSQL returns the schema as one script for other migration tools.
func (s *Store) MigrationSQL() string {
	return migrate.Script(idempotency.Component, migrations())
}

// MigrationStatus compares the shipped migrations with the database's.
func (s *Store) MigrationStatus(ctx context.Context) ([]inbox.MigrationState, error) {
	return pgmigrate.Status(ctx, s.db, idempotency.Component, migrations())
}

// CheckSchema reports idempotency.ErrNotMigrated unless every migration
// this package ships has been applied.
func (s *Store) CheckSchema(ctx context.Context) error {
	return pgmigrate.Check(ctx, s.db, idempotency.Component, migrations(), idempotency.ErrNotMigrated)
}

// Begin starts a READ COMMITTED transaction, waiting at most wait for a
// connection of the pool.
func (s *Store) Begin(ctx context.Context, wait time.Duration) (pgx.Tx, error) {
	bctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tx, err := s.db.Begin(bctx)
	if err != nil {
		if bctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("%w: no database connection within %v", idempotency.ErrBusy, wait)
		}
		return nil, fmt.Errorf("idempotency: begin: %w", err)
	}
	return tx, nil
}

const claimSQL = `INSERT INTO idempotency_keys (scope_hash, principal, method, route, key, fingerprint)
VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (scope_hash) DO NOTHING`

const storedSQL = `SELECT fingerprint, status, header, body, created_at FROM idempotency_keys WHERE scope_hash = $1`

// Claim inserts the key's row in tx, waiting at most wait for a
// transaction that holds it; one round trip when the key is new.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, sc idempotency.Scope, fp idempotency.Fingerprint, wait time.Duration) (*idempotency.Stored, error) {
	h := sc.Hash()
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(max(wait.Milliseconds(), 1), 10))
	b.Queue(claimSQL, h[:], sc.Principal, sc.Method, sc.Route, sc.Key, fp.String())
	b.Queue(`SET LOCAL lock_timeout TO DEFAULT`)
	br := tx.SendBatch(ctx, b)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
			return nil, idempotency.KeyHeld(err)
		}
		return nil, fmt.Errorf("idempotency: claim: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil, nil
	}
	st, err := scanStored(tx.QueryRow(ctx, storedSQL, h[:]))
	if err != nil {
		return nil, fmt.Errorf("idempotency: claim: read the stored answer: %w", err)
	}
	if st == nil {
		// Neither inserted nor there: retention deleted it between the two
		// statements. Running the request now could run it twice.
		return nil, idempotency.KeyHeld(errors.New("the key's row went away during the claim"))
	}
	return st, nil
}

func scanStored(row pgx.Row) (*idempotency.Stored, error) {
	var fp, header string
	var st idempotency.Stored
	if err := row.Scan(&fp, &st.Status, &header, &st.Body, &st.Created); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil
		}
		return nil, err
	}
	if st.Status == 0 {
		return nil, errors.New("a committed key without an answer")
	}
	st.Fingerprint = idempotency.ParseFingerprint(fp)
	st.Header = idempotency.DecodeHeader(header)
	return &st, nil
}

// Complete stores the answer under the key tx claimed.
func (s *Store) Complete(ctx context.Context, tx pgx.Tx, sc idempotency.Scope, a idempotency.Answer) error {
	h := sc.Hash()
	body := a.Body
	if body == nil {
		body = []byte{}
	}
	tag, err := tx.Exec(ctx, `UPDATE idempotency_keys SET status = $2, header = $3, body = $4 WHERE scope_hash = $1 AND status = 0`,
		h[:], a.Status, idempotency.EncodeHeader(a.Header), body)
	if err != nil {
		return fmt.Errorf("idempotency: store the answer: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return errors.New("idempotency: store the answer: the key is not claimed in this transaction")
	}
	return nil
}

// Commit commits tx. A COMMIT answered with success and the warning that
// its wait for the synchronous standby was cancelled (committed on the
// primary only; a failover would lose it) returns an error wrapping
// pginbox.ErrCommitNotReplicated: the handler answers 503, outcome
// unknown, and the client's retry with the key replays or runs it. The
// store sees that warning only on a pool made with pginbox.NewPool (or
// pginbox.WatchCommits on its configuration).
func (s *Store) Commit(ctx context.Context, tx pgx.Tx) error { return pgwatch.Commit(ctx, tx) }

// ReadPriorCommits writes an empty transactional logical-decoding message
// in tx, so that its COMMIT flushes and waits for the synchronous standby
// to confirm all WAL before it, the answer to be replayed included. A
// transaction that wrote nothing would commit without waiting.
func (s *Store) ReadPriorCommits(ctx context.Context, tx pgx.Tx) error {
	if err := pgwatch.ReadPriorCommits(ctx, tx); err != nil {
		return fmt.Errorf("idempotency: confirm the stored answer: %w", err)
	}
	return nil
}

// Rollback rolls tx back; after Commit it does nothing.
func (s *Store) Rollback(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// Lookup reads the committed answer under sc, nil when there is none.
func (s *Store) Lookup(ctx context.Context, sc idempotency.Scope) (*idempotency.Stored, error) {
	h := sc.Hash()
	st, err := scanStored(s.db.QueryRow(ctx, storedSQL, h[:]))
	if err != nil {
		return nil, fmt.Errorf("idempotency: lookup: %w", err)
	}
	return st, nil
}

// Prune deletes keys claimed more than opts.OlderThan ago (by
// PostgreSQL's clock) in batches of opts.BatchSize, and returns how many
// it deleted. It refuses, deleting nothing, an OlderThan shorter than
// opts.Retention (idempotency.PruneOptions.Checked).
func (s *Store) Prune(ctx context.Context, opts idempotency.PruneOptions) (int64, error) {
	opts, err := opts.Checked()
	if err != nil {
		return 0, err
	}
	var cutoff time.Time
	if err := s.db.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`, opts.OlderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("idempotency: prune: cut-off: %w", err)
	}
	var total int64
	for {
		tag, err := s.db.Exec(ctx, `DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY (
	SELECT ctid FROM idempotency_keys WHERE created_at < $1 LIMIT $2))`, cutoff, opts.BatchSize)
		if err != nil {
			return total, fmt.Errorf("idempotency: prune: %w", err)
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
