// Package sqliteidempotency keeps the keys of package idempotency in a
// SQLite file (opened as sqliteinbox.Open opens it): the key's row is
// claimed, and its answer stored, in the *sql.Tx the route's handler does
// its work in.
//
// SQLite has one writer: every request's transaction begins IMMEDIATE,
// so a duplicate's transaction cannot begin before the one holding its key
// ended, in this process (one connection) or another (busy_timeout). It
// then finds the answer committed, or no row (the first rolled back) and
// runs. Begin waits at most the handler's wait for the connection; past
// it the error wraps idempotency.ErrBusy.
package sqliteidempotency

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

var migrations = migrate.Embedded(migrationFS, "migrations")

// Store is the key table in a SQLite file; it implements
// idempotency.Store[*sql.Tx].
type Store struct {
	db    *sql.DB
	mu    sync.Mutex
	conns map[*sql.Tx]*sql.Conn
}

// New returns the store in db, opened by sqliteinbox.Open.
func New(db *sql.DB) *Store { return &Store{db: db, conns: map[*sql.Tx]*sql.Conn{}} }

var _ idempotency.Store[*sql.Tx] = (*Store)(nil)

// Migrate creates or upgrades the key table.
func (s *Store) Migrate(ctx context.Context) (int, error) {
	return migrate.ApplySQLite(ctx, s.db, idempotency.Component, migrations())
}

// MigrationSQL returns the schema as one script.
func (s *Store) MigrationSQL() string {
	return migrate.Script(idempotency.Component, migrations())
}

// MigrationStatus compares the shipped migrations with the file's.
func (s *Store) MigrationStatus(ctx context.Context) ([]inbox.MigrationState, error) {
	return migrate.StatusSQLite(ctx, s.db, idempotency.Component, migrations())
}

// CheckSchema reports idempotency.ErrNotMigrated unless every migration
// has been applied.
func (s *Store) CheckSchema(ctx context.Context) error {
	ms := migrations()
	want := ms[len(ms)-1].Version
	have, ok, err := migrate.VersionSQLite(ctx, s.db, idempotency.Component)
	switch {
	case err != nil:
		return fmt.Errorf("idempotency: check schema: %w", err)
	case !ok:
		return idempotency.ErrNotMigrated
	case have < want:
		return fmt.Errorf("%w: at version %d, this package needs %d", idempotency.ErrNotMigrated, have, want)
	}
	return nil
}

// Begin waits at most wait for the file's connection and begins an
// IMMEDIATE transaction on it (the writer's lock).
func (s *Store) Begin(ctx context.Context, wait time.Duration) (*sql.Tx, error) {
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	conn, err := s.db.Conn(cctx)
	if err != nil {
		if cctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("%w: the database's writer was busy for %v", idempotency.ErrBusy, wait)
		}
		return nil, fmt.Errorf("idempotency: begin: %w", err)
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: begin: %w", idempotency.ErrBusy, err)
	}
	s.mu.Lock()
	s.conns[tx] = conn
	s.mu.Unlock()
	return tx, nil
}

func (s *Store) release(tx *sql.Tx) {
	s.mu.Lock()
	conn := s.conns[tx]
	delete(s.conns, tx)
	s.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

const storedSQL = `SELECT fingerprint, status, header, body, created_at FROM idempotency_keys WHERE scope_hash = ?`

// Claim inserts the key's row in tx. With one writer, a row there is
// committed: its answer is returned.
func (s *Store) Claim(ctx context.Context, tx *sql.Tx, sc idempotency.Scope, fp idempotency.Fingerprint, _ time.Duration) (*idempotency.Stored, error) {
	h := sc.Hash()
	r, err := tx.ExecContext(ctx, `INSERT INTO idempotency_keys (scope_hash, principal, method, route, key, fingerprint, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (scope_hash) DO NOTHING`, h[:], sc.Principal, sc.Method, sc.Route, sc.Key, fp.String(), time.Now().UnixMicro())
	if err != nil {
		return nil, fmt.Errorf("idempotency: claim: %w", err)
	}
	if n, err := r.RowsAffected(); err != nil {
		return nil, fmt.Errorf("idempotency: claim: %w", err)
	} else if n == 1 {
		return nil, nil
	}
	st, err := scanStored(tx.QueryRowContext(ctx, storedSQL, h[:]))
	if err != nil {
		return nil, fmt.Errorf("idempotency: claim: read the stored answer: %w", err)
	}
	if st == nil {
		return nil, errors.New("idempotency: claim: the key's row is neither new nor there")
	}
	return st, nil
}

func scanStored(row *sql.Row) (*idempotency.Stored, error) {
	var fp, header string
	var created int64
	var st idempotency.Stored
	if err := row.Scan(&fp, &st.Status, &header, &st.Body, &created); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil
		}
		return nil, err
	}
	if st.Status == 0 {
		return nil, errors.New("a committed key without an answer")
	}
	st.Created = time.UnixMicro(created)
	st.Fingerprint = idempotency.ParseFingerprint(fp)
	st.Header = idempotency.DecodeHeader(header)
	return &st, nil
}

// Complete stores the answer under the key tx claimed.
func (s *Store) Complete(ctx context.Context, tx *sql.Tx, sc idempotency.Scope, a idempotency.Answer) error {
	h := sc.Hash()
	body := a.Body
	if body == nil {
		body = []byte{}
	}
	r, err := tx.ExecContext(ctx, `UPDATE idempotency_keys SET status = ?, header = ?, body = ? WHERE scope_hash = ? AND status = 0`,
		a.Status, idempotency.EncodeHeader(a.Header), body, h[:])
	if err != nil {
		return fmt.Errorf("idempotency: store the answer: %w", err)
	}
	if n, err := r.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("idempotency: store the answer: the key is not claimed in this transaction (%v)", err)
	}
	return nil
}

// ReadPriorCommits does nothing: SQLite has no standby, and a commit with
// synchronous=FULL is durable before it returns.
func (s *Store) ReadPriorCommits(context.Context, *sql.Tx) error { return nil }

// Commit commits tx and gives its connection back.
func (s *Store) Commit(_ context.Context, tx *sql.Tx) error {
	defer s.release(tx)
	return tx.Commit()
}

// Rollback rolls tx back and gives its connection back; after Commit it
// does nothing.
func (s *Store) Rollback(_ context.Context, tx *sql.Tx) error {
	defer s.release(tx)
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// Lookup reads the committed answer under sc, nil when there is none.
func (s *Store) Lookup(ctx context.Context, sc idempotency.Scope) (*idempotency.Stored, error) {
	h := sc.Hash()
	st, err := scanStored(s.db.QueryRowContext(ctx, storedSQL, h[:]))
	if err != nil {
		return nil, fmt.Errorf("idempotency: lookup: %w", err)
	}
	return st, nil
}

// Prune deletes keys claimed more than opts.OlderThan ago (by this
// machine's clock) in batches, refusing an OlderThan shorter than
// opts.Retention.
func (s *Store) Prune(ctx context.Context, opts idempotency.PruneOptions) (int64, error) {
	opts, err := opts.Checked()
	if err != nil {
		return 0, err
	}
	cutoff := time.Now().Add(-opts.OlderThan).UnixMicro()
	var total int64
	for {
		r, err := s.db.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE scope_hash IN (
	SELECT scope_hash FROM idempotency_keys WHERE created_at < ? LIMIT ?)`, cutoff, opts.BatchSize)
		if err != nil {
			return total, fmt.Errorf("idempotency: prune: %w", err)
		}
		n, _ := r.RowsAffected()
		total += n
		if n < int64(opts.BatchSize) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}
