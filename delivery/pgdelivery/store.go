// Package pgdelivery keeps deliveries in PostgreSQL: [Add] writes an
// effect's calls in its own transaction (a pgx.Tx), and a [Store] is the
// [delivery.Store] a dispatcher leases rows from, with the schema, the
// dead letters and their redrive. See package delivery for the design.
package pgdelivery

import (
	"context"
	"embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

var migrations = migrate.Embedded(migrationFS, "migrations")

// Querier is what [Add] writes through: the effect's pgx.Tx, so the
// delivery commits or rolls back with the effect.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// DB is the database a [Store] runs on: *pgxpool.Pool or *pgx.Conn.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Add writes intents in tx, the effect's transaction: each is sent if and
// only if tx commits. An intent already there (same scope, message ID and
// endpoint) is a repeat of the same work and is left alone. Bad input
// wraps [delivery.ErrBadIntent] and writes nothing.
func Add(ctx context.Context, tx Querier, intents ...delivery.Intent) error {
	if len(intents) == 0 {
		return nil
	}
	scopes := make([]string, len(intents))
	ids := make([]string, len(intents))
	eps := make([]string, len(intents))
	keys := make([]string, len(intents))
	payloads := make([][]byte, len(intents))
	for i, in := range intents {
		if err := in.Validate(); err != nil {
			return err
		}
		scopes[i], ids[i], eps[i] = in.Scope, in.MessageID, in.Endpoint
		keys[i] = delivery.Key(in.Scope, in.MessageID, in.Endpoint)
		payloads[i] = in.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO deliveries (scope, message_id, endpoint, idem_key, payload)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[])
ON CONFLICT (scope, message_id, endpoint) DO NOTHING`, scopes, ids, eps, keys, payloads)
	if err != nil {
		return fmt.Errorf("delivery: add: %w", err)
	}
	return nil
}

// Store is the deliveries table in PostgreSQL.
type Store struct{ db DB }

// New returns the store on db.
func New(db DB) *Store { return &Store{db: db} }

// Migrate creates or upgrades the deliveries table, recording applied
// versions under [delivery.Component]; `jetinbox migrate` calls it.
func (s *Store) Migrate(ctx context.Context) (int, error) {
	return pgmigrate.Apply(ctx, s.db, delivery.Component, migrations())
}

// MigrationSQL returns the schema as one SQL script.
func (s *Store) MigrationSQL() string { return migrate.Script(delivery.Component, migrations()) }

// MigrationStatus compares the shipped migrations with the database's.
func (s *Store) MigrationStatus(ctx context.Context) ([]inbox.MigrationState, error) {
	return pgmigrate.Status(ctx, s.db, delivery.Component, migrations())
}

// CheckSchema reports [delivery.ErrNotMigrated] unless every migration
// this package ships has been applied.
func (s *Store) CheckSchema(ctx context.Context) error {
	return pgmigrate.Check(ctx, s.db, delivery.Component, migrations(), delivery.ErrNotMigrated)
}

// Lease implements [delivery.Store]: one statement, SKIP LOCKED so that
// dispatchers never wait for each other.
func (s *Store) Lease(ctx context.Context, owner, endpoint string, n int, d time.Duration) ([]delivery.Delivery, error) {
	rows, err := s.db.Query(ctx, `UPDATE deliveries d SET leased_by = $1, lease_until = now() + $2::bigint * interval '1 microsecond',
	attempts = d.attempts + 1, first_attempt_at = coalesce(d.first_attempt_at, now())
WHERE d.id IN (SELECT id FROM deliveries WHERE state = 'pending' AND endpoint = $3 AND next_at <= now()
	AND (lease_until IS NULL OR lease_until < now()) ORDER BY next_at LIMIT $4 FOR UPDATE SKIP LOCKED)
RETURNING d.id, d.scope, d.message_id, d.endpoint, d.idem_key, d.payload, d.attempts, d.first_attempt_at, d.created_at`,
		owner, d.Microseconds(), endpoint, n)
	if err != nil {
		return nil, fmt.Errorf("delivery: lease: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (delivery.Delivery, error) {
		var x delivery.Delivery
		err := r.Scan(&x.ID, &x.Scope, &x.MessageID, &x.Endpoint, &x.Key, &x.Payload, &x.Attempts, &x.FirstAttempt, &x.Created)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("delivery: lease: %w", err)
	}
	return out, nil
}

// Record implements [delivery.Store].
func (s *Store) Record(ctx context.Context, owner string, id int64, r delivery.Result) error {
	var done any
	if r.State != delivery.StatePending {
		done = "now"
	}
	tag, err := s.db.Exec(ctx, `UPDATE deliveries SET state = $3, leased_by = NULL, lease_until = NULL,
	next_at = now() + $4::bigint * interval '1 microsecond', last_status = $5, last_body = $6, reason = $7, last_at = now(),
	done_at = CASE WHEN $8::text IS NULL THEN NULL ELSE now() END
WHERE id = $1 AND leased_by = $2 AND state = 'pending'`,
		id, owner, string(r.State), r.RetryIn.Microseconds(), nullStatus(r.Status), r.Body, nullText(r.Reason), done)
	if err != nil {
		return fmt.Errorf("delivery: record: %w", err)
	}
	if tag.RowsAffected() == 0 {
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
	rows, err := s.db.Query(ctx, `SELECT id, scope, message_id, endpoint, idem_key, payload, attempts, first_attempt_at, created_at,
	state, coalesce(last_status, 0), coalesce(last_body, ''), coalesce(reason, ''), coalesce(last_at, created_at)
FROM deliveries WHERE state = $1 AND ($2 = '' OR endpoint = $2) ORDER BY id LIMIT $3`, string(state), endpoint, limit)
	if err != nil {
		return nil, fmt.Errorf("delivery: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (delivery.Row, error) {
		var x delivery.Row
		var first *time.Time
		var st string
		err := r.Scan(&x.ID, &x.Scope, &x.MessageID, &x.Endpoint, &x.Key, &x.Payload, &x.Attempts, &first, &x.Created,
			&st, &x.LastStatus, &x.LastBody, &x.Reason, &x.LastAt)
		if first != nil {
			x.FirstAttempt = *first
		}
		x.State = delivery.State(st)
		return x, err
	})
	if err != nil {
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
	tag, err := s.db.Exec(ctx, `UPDATE deliveries SET state = 'pending', next_at = now(), first_attempt_at = NULL, attempts = 0,
	leased_by = NULL, lease_until = NULL, done_at = NULL
WHERE state = 'dead' AND ($1 = '' OR endpoint = $1) AND (coalesce(cardinality($2::bigint[]), 0) = 0 OR id = ANY($2))`, endpoint, ids)
	if err != nil {
		return 0, fmt.Errorf("delivery: redrive: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Backlog returns how many rows are pending and how long the oldest has
// waited since it was written, by PostgreSQL's clock.
func (s *Store) Backlog(ctx context.Context) (int64, time.Duration, error) {
	var n int64
	var oldest float64
	rows, err := s.db.Query(ctx, `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM deliveries WHERE state = 'pending'`)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&n, &oldest}, func() error { return nil })
	}
	if err != nil {
		return 0, 0, fmt.Errorf("delivery: backlog: %w", err)
	}
	return n, time.Duration(oldest * float64(time.Second)), nil
}

var _ delivery.Store = (*Store)(nil)
