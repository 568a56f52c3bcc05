// Package sqliteoutbox keeps the outbox in a SQLite file, next to an inbox
// of package sqliteinbox: [Add] in the batch's (or the service's own)
// *sql.Tx, and a [Store] (New, or sqliteinbox.Store.Outbox for the inbox's
// file) that carries the schema, retention and backlog and is the
// outbox.Source a relay (outbox.NewRelay) takes rows from.
//
// SQLite has one writer and no row locks a relay could hold while it
// publishes, so a relay leases a batch instead: one short transaction sets
// lease_until on the oldest pending rows nobody holds, the relay publishes
// them, and a second short transaction marks them sent. A relay that dies in
// between leaves its rows leased until the lease runs out; then any relay
// publishes them again with the same IDs, which the stream (inside its
// duplicate window) or the next inbox drops. Each lease carries a token of
// the claim that made it: a relay that outlived its lease marks and gives
// back only the rows still leased to it, never rows another relay has taken
// over since (which would let a third relay send them once more), and
// reports the others (outbox.NotHeldError). There is no notification: the
// relay polls with its jittered Idle waits.
package sqliteoutbox

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/outbox"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations are the embedded migrations, read once.
var migrations = migrate.Embedded(migrationFS, "migrations")

// DefaultLease is how long a relay holds the rows it took before another
// relay may take them: longer than a round can last (the publisher's retry
// budget and its PubAck wait).
const DefaultLease = 2 * time.Minute

// Store is the outbox in a SQLite file: its schema, retention and backlog,
// and the outbox.Source a relay takes rows from (outbox.NewRelay takes the
// Store itself). Rows are added with [Add] in the caller's own *sql.Tx,
// not through the Store.
type Store struct {
	db    *sql.DB
	lease time.Duration
}

// New returns the outbox store in db, opened as sqliteinbox.Open opens it.
// A relay holds the rows it takes for [DefaultLease]; see [Store.WithLease].
func New(db *sql.DB) *Store { return &Store{db: db, lease: DefaultLease} }

// WithLease returns a copy of s whose relay holds the rows it takes for
// lease (0: [DefaultLease]) before another relay may take them.
func (s *Store) WithLease(lease time.Duration) *Store {
	if lease <= 0 {
		lease = DefaultLease
	}
	c := *s
	c.lease = lease
	return &c
}

// Migrate creates or upgrades the outbox table and returns how many
// migrations it applied.
func (s *Store) Migrate(ctx context.Context) (int, error) {
	return migrate.ApplySQLite(ctx, s.db, outbox.Component, migrations())
}

// MigrationStatus compares the outbox migrations with what the file
// recorded.
func (s *Store) MigrationStatus(ctx context.Context) ([]inbox.MigrationState, error) {
	return migrate.StatusSQLite(ctx, s.db, outbox.Component, migrations())
}

// MigrationSQL returns the SQLite outbox schema as one SQL script. It does
// not touch the database.
func (s *Store) MigrationSQL() string { return migrate.Script(outbox.Component, migrations()) }

// CheckSchema reports outbox.ErrNotMigrated unless every outbox migration
// has been applied.
func (s *Store) CheckSchema(ctx context.Context) error {
	ms := migrations()
	want := ms[len(ms)-1].Version
	have, ok, err := migrate.VersionSQLite(ctx, s.db, outbox.Component)
	switch {
	case err != nil:
		return fmt.Errorf("outbox: check schema: %w", err)
	case !ok:
		return outbox.ErrNotMigrated
	case have < want:
		return fmt.Errorf("%w: at version %d, this package needs %d", outbox.ErrNotMigrated, have, want)
	}
	return nil
}

// Add writes intents to the outbox in tx, as pgoutbox.Add does on PostgreSQL:
// an ID already there with the same subject and payload is left alone, with
// another one the error wraps inbox.ErrConflict (roll tx back), bad input
// wraps inbox.ErrBadIntent.
func Add(ctx context.Context, tx *sql.Tx, intents ...inbox.Intent) error {
	now := time.Now().UnixMicro()
	for i := range intents {
		in := &intents[i]
		if err := in.Validate(); err != nil {
			return err
		}
		fp := inbox.Fingerprint(in.Payload)
		payload := in.Payload
		if payload == nil {
			payload = []byte{}
		}
		r, err := tx.ExecContext(ctx, `INSERT INTO outbox (id, subject, payload, fingerprint, parent_id, created_at) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO NOTHING`, in.ID, in.Subject, payload, fp[:], in.Parent, now)
		if err != nil {
			return fmt.Errorf("outbox: add: %w", err)
		}
		if n, err := r.RowsAffected(); err != nil {
			return fmt.Errorf("outbox: add: %w", err)
		} else if n == 1 {
			continue
		}
		var subject string
		var have []byte
		if err := tx.QueryRowContext(ctx, `SELECT subject, fingerprint FROM outbox WHERE id = ?`, in.ID).Scan(&subject, &have); err != nil {
			return fmt.Errorf("outbox: add: %s: %w", in.ID, err)
		}
		if subject != in.Subject || !bytes.Equal(have, fp[:]) {
			return fmt.Errorf("%w: %s; roll the transaction back", inbox.ErrConflict, in.ID)
		}
	}
	return nil
}

// Take leases up to n pending rows, oldest first, that no relay holds; it
// is outbox.Source's method.
func (s *Store) Take(ctx context.Context, n int) (outbox.Taken, error) {
	now := time.Now().UnixMicro()
	// The token names this claim. A later claim of a row sets a later
	// lease_until as well (it takes only rows whose lease ended before its
	// now), so the pair also tells a claim of a relay that sets only
	// lease_until apart from this one.
	t := &taken{db: s.db, token: rand.Int64(), until: now + s.lease.Microseconds()}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	rows, err := tx.QueryContext(ctx, `UPDATE outbox SET lease_until = ?, lease_token = ?
WHERE seq IN (SELECT seq FROM outbox WHERE sent_at IS NULL AND failed IS NULL AND (lease_until IS NULL OR lease_until < ?) ORDER BY seq LIMIT ?)
RETURNING seq, id, subject, payload`, t.until, t.token, now, n)
	if err != nil {
		return nil, err
	}
	type seqRow struct {
		seq int64
		row outbox.Row
	}
	var got []seqRow
	for rows.Next() {
		var r seqRow
		if err := rows.Scan(&r.seq, &r.row.ID, &r.row.Subject, &r.row.Payload); err != nil {
			rows.Close()
			return nil, err
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows.Close()
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	slices.SortFunc(got, func(a, b seqRow) int { return int(a.seq - b.seq) })
	for _, r := range got {
		t.rows = append(t.rows, r.row)
	}
	return t, nil
}

type taken struct {
	db   *sql.DB
	rows []outbox.Row
	done bool
	// token and until are what the claim set on its rows; a row that no
	// longer has both has been taken over by another relay.
	token, until int64
}

func (t *taken) Rows() []outbox.Row { return t.rows }

// placeholders returns "?, ?, …" for n values.
func placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?, ", n), ", ") }

func (t *taken) Finish(ctx context.Context, sent []string, failed map[string]string) ([]time.Duration, error) {
	now := time.Now().UnixMicro()
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	var lags []time.Duration
	var notHeld []string
	for start := 0; start < len(sent); start += 500 {
		part := sent[start:min(len(sent), start+500)]
		args := []any{now, t.token, t.until}
		for _, id := range part {
			args = append(args, id)
		}
		rows, err := tx.QueryContext(ctx, `UPDATE outbox SET sent_at = ?1, lease_until = NULL, lease_token = NULL
WHERE lease_token = ?2 AND lease_until = ?3 AND id IN (`+placeholders(len(part))+`) RETURNING id, sent_at - created_at`, args...)
		if err != nil {
			return nil, fmt.Errorf("mark sent: %w", err)
		}
		var marked []string
		for rows.Next() {
			var id string
			var us int64
			if err := rows.Scan(&id, &us); err != nil {
				rows.Close()
				return nil, fmt.Errorf("mark sent: %w", err)
			}
			marked = append(marked, id)
			lags = append(lags, time.Duration(us)*time.Microsecond)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("mark sent: %w", err)
		}
		rows.Close()
		if len(marked) < len(part) {
			for _, id := range part {
				if !slices.Contains(marked, id) {
					notHeld = append(notHeld, id)
				}
			}
		}
	}
	for id, why := range failed {
		r, err := tx.ExecContext(ctx, `UPDATE outbox SET failed = ?, lease_until = NULL, lease_token = NULL WHERE lease_token = ? AND lease_until = ? AND id = ?`, why, t.token, t.until, id)
		if err != nil {
			return nil, fmt.Errorf("mark failed: %w", err)
		}
		if n, err := r.RowsAffected(); err != nil {
			return nil, fmt.Errorf("mark failed: %w", err)
		} else if n == 0 {
			notHeld = append(notHeld, id)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	t.done = true
	if len(notHeld) > 0 {
		return lags, &outbox.NotHeldError{IDs: notHeld}
	}
	return lags, nil
}

// Abandon gives back at once the rows still leased to this claim, best
// effort: if it fails, their lease runs out.
func (t *taken) Abandon(ctx context.Context) {
	if t.done || len(t.rows) == 0 {
		return
	}
	t.done = true
	args := make([]any, 0, len(t.rows)+2)
	args = append(args, t.token, t.until)
	for _, r := range t.rows {
		args = append(args, r.ID)
	}
	_, _ = t.db.ExecContext(ctx, `UPDATE outbox SET lease_until = NULL, lease_token = NULL
WHERE lease_token = ?1 AND lease_until = ?2 AND id IN (`+placeholders(len(t.rows))+`)`, args...)
}

// Prune deletes sent outbox rows created longer than opts.OlderThan ago,
// with outbox.PruneOptions.Checked's horizon check; pending and failed rows stay.
// The cut-off comes from this machine's clock, the one created_at was
// written with.
func (s *Store) Prune(ctx context.Context, opts outbox.PruneOptions) (int64, error) {
	opts, err := opts.Checked()
	if err != nil {
		return 0, err
	}
	cutoff := time.Now().Add(-opts.OlderThan).UnixMicro()
	var total int64
	for {
		r, err := s.db.ExecContext(ctx, `DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE created_at < ? AND sent_at IS NOT NULL LIMIT ?)`, cutoff, opts.BatchSize)
		if err != nil {
			return total, fmt.Errorf("outbox: prune: %w", err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("outbox: prune: %w", err)
		}
		total += n
		if n < int64(opts.BatchSize) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// Backlog returns how many rows wait to be published and how long the
// oldest has waited, by this machine's clock.
func (s *Store) Backlog(ctx context.Context) (int64, time.Duration, error) {
	var n int64
	var oldest sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT count(*), min(created_at) FROM outbox WHERE sent_at IS NULL AND failed IS NULL`).Scan(&n, &oldest); err != nil {
		return 0, 0, fmt.Errorf("outbox: backlog: %w", err)
	}
	if !oldest.Valid {
		return n, 0, nil
	}
	return n, time.Since(time.UnixMicro(oldest.Int64)), nil
}

var _ outbox.Source = (*Store)(nil)
