// Package sqlitedelivery keeps deliveries in a SQLite file, next to an
// inbox of package sqliteinbox: [Add] writes an effect's calls in the
// batch's own *sql.Tx, and a [Store] is the [delivery.Store] a dispatcher
// leases rows from, with the schema, the dead letters and their redrive.
// It behaves as package pgdelivery does on PostgreSQL; see package
// delivery for the design.
//
// SQLite has one writer and no row locks a dispatcher could hold while it
// calls, so a lease is a column: one short write sets leased_by and
// lease_until on the due rows nobody holds, the call is made outside any
// transaction, and a second short write records its outcome, only if the
// row is still leased to the same dispatcher. A dispatcher that dies in
// between leaves its rows leased until the lease runs out; then any
// dispatcher sends them again with the same key. Several dispatchers may
// share one file: each write takes the file's write lock (the transactions
// of a database opened by sqliteinbox.Open begin IMMEDIATE and wait for the
// lock up to its busy timeout), so two never lease the same row.
//
// Open the file with sqliteinbox.Open (WAL, synchronous=FULL,
// busy_timeout, IMMEDIATE transactions). Times are kept in microseconds
// since the Unix epoch by this machine's clock: the dispatchers of one file
// run on the machine that holds it.
package sqlitedelivery

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

var migrations = migrate.Embedded(migrationFS, "migrations")

// Execer is what [Add] writes through: the effect's *sql.Tx, so the
// delivery commits or rolls back with the effect.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// addChunk is how many intents one INSERT carries (7 values each, well
// inside SQLite's limit on bound parameters).
const addChunk = 500

// Add writes intents in tx, the effect's transaction: each is sent if and
// only if tx commits. An intent already there (same scope, message ID and
// endpoint) is a repeat of the same work and is left alone. Bad input
// wraps [delivery.ErrBadIntent] and writes nothing.
func Add(ctx context.Context, tx Execer, intents ...delivery.Intent) error {
	for _, in := range intents {
		if err := in.Validate(); err != nil {
			return err
		}
	}
	now := time.Now().UnixMicro()
	for start := 0; start < len(intents); start += addChunk {
		part := intents[start:min(len(intents), start+addChunk)]
		args := make([]any, 0, 7*len(part))
		for _, in := range part {
			payload := in.Payload
			if payload == nil {
				payload = []byte{}
			}
			args = append(args, in.Scope, in.MessageID, in.Endpoint, delivery.Key(in.Scope, in.MessageID, in.Endpoint), payload, now, now)
		}
		q := `INSERT INTO deliveries (scope, message_id, endpoint, idem_key, payload, created_at, next_at) VALUES ` +
			strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?), ", len(part)), ", ") +
			` ON CONFLICT (scope, message_id, endpoint) DO NOTHING`
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("delivery: add: %w", err)
		}
	}
	return nil
}

// Store is the deliveries table in a SQLite file.
type Store struct{ db *sql.DB }

// New returns the store on db, opened as sqliteinbox.Open opens it.
func New(db *sql.DB) *Store { return &Store{db: db} }

// Migrate creates or upgrades the deliveries table, recording applied
// versions under [delivery.Component]; `jetinbox migrate` calls it.
func (s *Store) Migrate(ctx context.Context) (int, error) {
	return migrate.ApplySQLite(ctx, s.db, delivery.Component, migrations())
}

// MigrationSQL returns the schema as one SQL script. It does not touch the
// database.
func (s *Store) MigrationSQL() string { return migrate.Script(delivery.Component, migrations()) }

// MigrationStatus compares the shipped migrations with the file's.
func (s *Store) MigrationStatus(ctx context.Context) ([]inbox.MigrationState, error) {
	return migrate.StatusSQLite(ctx, s.db, delivery.Component, migrations())
}

// CheckSchema reports [delivery.ErrNotMigrated] unless every migration
// this package ships has been applied.
func (s *Store) CheckSchema(ctx context.Context) error {
	ms := migrations()
	want := ms[len(ms)-1].Version
	have, ok, err := migrate.VersionSQLite(ctx, s.db, delivery.Component)
	switch {
	case err != nil:
		return fmt.Errorf("delivery: check schema: %w", err)
	case !ok:
		return delivery.ErrNotMigrated
	case have < want:
		return fmt.Errorf("%w: at version %d, this package needs %d", delivery.ErrNotMigrated, have, want)
	}
	return nil
}

// Lease implements [delivery.Store]: one short write transaction (it takes
// the file's write lock, so dispatchers on one file take turns and never
// lease the same row). An idle poll only reads: WAL readers neither wait
// for the writer nor hold it up, so idle dispatchers do not slow the
// consumer's inbox transactions down.
func (s *Store) Lease(ctx context.Context, owner, endpoint string, n int, d time.Duration) ([]delivery.Delivery, error) {
	now := time.Now().UnixMicro()
	var some int
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT 1 FROM deliveries WHERE state = 'pending' AND endpoint = ?1 AND next_at <= ?2
	AND (lease_until IS NULL OR lease_until < ?2) LIMIT 1)`, endpoint, now).Scan(&some)
	if err != nil {
		return nil, fmt.Errorf("delivery: lease: %w", err)
	}
	if some == 0 {
		return nil, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("delivery: lease: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	rows, err := tx.QueryContext(ctx, `UPDATE deliveries SET leased_by = ?1, lease_until = ?2 + ?3,
	attempts = attempts + 1, first_attempt_at = coalesce(first_attempt_at, ?2)
WHERE id IN (SELECT id FROM deliveries WHERE state = 'pending' AND endpoint = ?4 AND next_at <= ?2
	AND (lease_until IS NULL OR lease_until < ?2) ORDER BY next_at LIMIT ?5)
RETURNING id, scope, message_id, endpoint, idem_key, payload, attempts, first_attempt_at, created_at, next_at`,
		owner, now, d.Microseconds(), endpoint, n)
	if err != nil {
		return nil, fmt.Errorf("delivery: lease: %w", err)
	}
	type due struct {
		d    delivery.Delivery
		next int64
	}
	var got []due
	for rows.Next() {
		var x due
		var first, created int64
		if err := rows.Scan(&x.d.ID, &x.d.Scope, &x.d.MessageID, &x.d.Endpoint, &x.d.Key, &x.d.Payload, &x.d.Attempts, &first, &created, &x.next); err != nil {
			rows.Close()
			return nil, fmt.Errorf("delivery: lease: %w", err)
		}
		x.d.FirstAttempt, x.d.Created = time.UnixMicro(first), time.UnixMicro(created)
		got = append(got, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("delivery: lease: %w", err)
	}
	rows.Close()
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("delivery: lease: commit: %w", err)
	}
	// RETURNING gives no order: send the longest due first.
	slices.SortFunc(got, func(a, b due) int {
		if a.next != b.next {
			return int(a.next - b.next)
		}
		return int(a.d.ID - b.d.ID)
	})
	out := make([]delivery.Delivery, len(got))
	for i := range got {
		out[i] = got[i].d
	}
	return out, nil
}

// Record implements [delivery.Store]: the outcome is stored only while the
// row is still pending and leased to owner.
func (s *Store) Record(ctx context.Context, owner string, id int64, r delivery.Result) error {
	now := time.Now().UnixMicro()
	var done any
	if r.State != delivery.StatePending {
		done = now
	}
	var res sql.Result
	var err error
	// A lock that stayed busy past the busy timeout is tried again while
	// ctx lasts: an outcome not recorded is a call made again (same key,
	// after the lease).
	for try := 1; ; try++ {
		res, err = s.db.ExecContext(ctx, `UPDATE deliveries SET state = ?3, leased_by = NULL, lease_until = NULL,
	next_at = ?4, last_status = ?5, last_body = ?6, reason = ?7, last_at = ?8, done_at = ?9
WHERE id = ?1 AND leased_by = ?2 AND state = 'pending'`,
			id, owner, string(r.State), now+r.RetryIn.Microseconds(), nullStatus(r.Status), r.Body, nullText(r.Reason), now, done)
		if err == nil || try == 3 || sqliteinbox.Classify(err) != driver.ErrorRetryTx || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("delivery: record: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("delivery: record: %w", err)
	}
	if n == 0 {
		return delivery.ErrLeaseLost
	}
	return nil
}

func nullStatus(s int) any {
	if s == 0 {
		return nil
	}
	return s
}

func nullText(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// List returns up to limit rows in state (all endpoints when endpoint is
// empty), oldest first.
func (s *Store) List(ctx context.Context, state delivery.State, endpoint string, limit int) ([]delivery.Row, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, scope, message_id, endpoint, idem_key, payload, attempts, first_attempt_at, created_at,
	state, coalesce(last_status, 0), coalesce(last_body, x''), coalesce(reason, ''), coalesce(last_at, created_at)
FROM deliveries WHERE state = ?1 AND (?2 = '' OR endpoint = ?2) ORDER BY id LIMIT ?3`, string(state), endpoint, limit)
	if err != nil {
		return nil, fmt.Errorf("delivery: list: %w", err)
	}
	defer rows.Close()
	var out []delivery.Row
	for rows.Next() {
		var x delivery.Row
		var first sql.NullInt64
		var created, last int64
		var st string
		if err := rows.Scan(&x.ID, &x.Scope, &x.MessageID, &x.Endpoint, &x.Key, &x.Payload, &x.Attempts, &first, &created,
			&st, &x.LastStatus, &x.LastBody, &x.Reason, &last); err != nil {
			return nil, fmt.Errorf("delivery: list: %w", err)
		}
		if first.Valid {
			x.FirstAttempt = time.UnixMicro(first.Int64)
		}
		x.Created, x.LastAt, x.State = time.UnixMicro(created), time.UnixMicro(last), delivery.State(st)
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("delivery: list: %w", err)
	}
	return out, nil
}

// Redrive makes dead rows pending again, due now, with the same key: the
// rows with the given IDs, or every dead row of endpoint when ids is empty
// (every dead row when endpoint is empty too). Their retention starts
// again from the next attempt, so redrive a row dead-lettered "outcome
// unknown" only after reconciling with the receiver. It returns how many
// rows it made pending.
func (s *Store) Redrive(ctx context.Context, endpoint string, ids []int64) (int64, error) {
	const set = `UPDATE deliveries SET state = 'pending', next_at = ?1, first_attempt_at = NULL, attempts = 0,
	leased_by = NULL, lease_until = NULL, done_at = NULL
WHERE state = 'dead' AND (?2 = '' OR endpoint = ?2)`
	now := time.Now().UnixMicro()
	if len(ids) == 0 {
		res, err := s.db.ExecContext(ctx, set, now, endpoint)
		if err != nil {
			return 0, fmt.Errorf("delivery: redrive: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("delivery: redrive: %w", err)
		}
		return n, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("delivery: redrive: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	var total int64
	for start := 0; start < len(ids); start += addChunk {
		part := ids[start:min(len(ids), start+addChunk)]
		args := []any{now, endpoint}
		for _, id := range part {
			args = append(args, id)
		}
		res, err := tx.ExecContext(ctx, set+` AND id IN (`+strings.TrimSuffix(strings.Repeat("?, ", len(part)), ", ")+`)`, args...)
		if err != nil {
			return 0, fmt.Errorf("delivery: redrive: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("delivery: redrive: %w", err)
		}
		total += n
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("delivery: redrive: commit: %w", err)
	}
	return total, nil
}

// Backlog returns how many rows are pending and how long the oldest has
// waited since it was written, by this machine's clock.
func (s *Store) Backlog(ctx context.Context) (int64, time.Duration, error) {
	var n int64
	var oldest sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT count(*), min(created_at) FROM deliveries WHERE state = 'pending'`).Scan(&n, &oldest); err != nil {
		return 0, 0, fmt.Errorf("delivery: backlog: %w", err)
	}
	if !oldest.Valid {
		return n, 0, nil
	}
	return n, max(time.Since(time.UnixMicro(oldest.Int64)), 0), nil
}

var _ delivery.Store = (*Store)(nil)
