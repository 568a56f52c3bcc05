package shard

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

var migrations = migrate.Embedded(migrationFS, "migrations")

// Migrate creates the partition table in a shard's database (the inbox
// and ledger schemas come from their own packages) and records the map's
// partitions of the shard as owned where the table has no row for them
// yet: a row the table has (a partition moved here or away) is the truth
// and stays.
func Migrate(ctx context.Context, pool *pgxpool.Pool, m *Map, shard string) (int, error) {
	n, err := pgmigrate.Apply(ctx, pool, "shard", migrations())
	if err != nil {
		return n, err
	}
	s, err := m.Shard(shard)
	if err != nil {
		return n, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO jetinbox_partitions (scope, partition, owned)
SELECT $1, p, true FROM unnest($2::int[]) AS p ON CONFLICT DO NOTHING`, m.Scope, []int(s.Partitions)); err != nil {
		return n, fmt.Errorf("shard: record partitions: %w", err)
	}
	return n, nil
}

// Owned returns the partitions the database says it owns.
func Owned(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, scope string) (Set, error) {
	rows, err := db.Query(ctx, `SELECT partition FROM jetinbox_partitions WHERE scope = $1 AND owned ORDER BY partition`, scope)
	if err != nil {
		return nil, fmt.Errorf("shard: owned partitions: %w", err)
	}
	s, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("shard: owned partitions: %w", err)
	}
	return Set(s), nil
}

// ErrNotOwned is the retryable error of a message whose partition this
// shard does not own (any more): its claim is released and it is nak'd,
// for the partition's owner to take.
var ErrNotOwned = errors.New("shard: partition not owned by this shard")

// fenceSQL locks the batch's owned partition rows until the transaction
// ends: a move's UPDATE of one waits for this batch to commit, and once it
// committed this returns the partition no more.
const fenceSQL = `SELECT partition FROM jetinbox_partitions WHERE scope = $1 AND partition = ANY($2::int[]) AND owned FOR SHARE`

// Fenced wraps the effect: in the batch's transaction it first locks the
// rows of the batch's partitions that the shard owns, fails the messages
// of the others with [ErrNotOwned], and applies the rest. One statement per
// batch.
type Fenced struct {
	Map   *Map
	Inner inbox.Handler[pgx.Tx]
}

// Handle implements [inbox.Handler[pgx.Tx]].
func (f *Fenced) Handle(ctx context.Context, tx pgx.Tx, msgs []inbox.Message, errs []error) error {
	scope, _ := inbox.ScopeFromContext(ctx)
	if scope == "" {
		scope = f.Map.Scope
	}
	parts := make([]int, len(msgs))
	var want []int
	for i := range msgs {
		ps, err := ParseStored(f.Map.Subject, msgs[i].Subject)
		if err != nil {
			// The processor wrapper rejects these before the claim; an
			// effect run without it refuses them here.
			errs[i] = inbox.BadInput(err)
			parts[i] = -1
			continue
		}
		parts[i] = ps.Partition
		if !slices.Contains(want, ps.Partition) {
			want = append(want, ps.Partition)
		}
	}
	if len(want) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, fenceSQL, scope, want)
	if err != nil {
		return fmt.Errorf("shard: fence: %w", err)
	}
	owned, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("shard: fence: %w", err)
	}
	sub := make([]inbox.Message, 0, len(msgs))
	idx := make([]int, 0, len(msgs))
	for i := range msgs {
		switch {
		case parts[i] < 0:
		case !slices.Contains(owned, parts[i]):
			errs[i] = fmt.Errorf("%w: partition %d", ErrNotOwned, parts[i])
		default:
			sub = append(sub, msgs[i])
			idx = append(idx, i)
		}
	}
	if len(sub) == 0 {
		return nil
	}
	if len(sub) == len(msgs) {
		return f.Inner.Handle(ctx, tx, msgs, errs)
	}
	subErrs := make([]error, len(sub))
	if err := f.Inner.Handle(ctx, tx, sub, subErrs); err != nil {
		return err
	}
	for j, i := range idx {
		errs[i] = subErrs[j]
	}
	return nil
}

// Warm prepares the inner effect's statements, if it has any.
func (f *Fenced) Warm(ctx context.Context, tx pgx.Tx) error {
	if w, ok := f.Inner.(inbox.Warmer[pgx.Tx]); ok {
		return w.Warm(ctx, tx)
	}
	return nil
}
