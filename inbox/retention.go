package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs a statement. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// PruneDB runs statements and queries. *pgxpool.Pool, *pgx.Conn and pgx.Tx
// satisfy it.
type PruneDB interface {
	Execer
	Querier
}

// DefaultPruneMargin is how much longer than the replay horizon [Prune]
// requires OlderThan to be, by default. It absorbs what the horizon's
// arithmetic cannot see: the skew between the clocks the horizon's parts
// run on (the NATS servers' for MaxAge and the duplicate window,
// PostgreSQL's for received_at and the cut-off), the time a batch spends
// between delivery and commit, and the prune's own running time.
const DefaultPruneMargin = time.Hour

// PruneOptions configures [Prune].
type PruneOptions struct {
	// Scope limits pruning to one scope. Default "": every scope.
	Scope string
	// OlderThan deletes rows received more than this long ago, by
	// PostgreSQL's clock: received_at comes from its now(), and so does the
	// cut-off. It must be strictly longer than ReplayHorizon + Margin.
	// Required.
	OlderThan time.Duration
	// ReplayHorizon is the longest time after an inbox row was written that
	// its message ID can still reach the inbox: stream MaxAge, redeliveries
	// (MaxDeliver × (AckWait + longest nak delay)), late copies after the
	// duplicate window, dead-letter re-drives. A row pruned inside it would
	// let a message come back and apply its effect twice. Required.
	ReplayHorizon time.Duration
	// Margin is added to ReplayHorizon before comparing. Default
	// [DefaultPruneMargin].
	Margin time.Duration
	// BatchSize is how many rows one DELETE removes, keeping locks and WAL
	// bursts small. Default 10000.
	BatchSize int
}

// Checked returns o with its defaults filled in, or [ErrUnsafeHorizon]
// unless OlderThan is strictly longer than ReplayHorizon + Margin. Every
// store's prune checks its options with it.
func (o PruneOptions) Checked() (PruneOptions, error) {
	if o.ReplayHorizon <= 0 {
		return o, errors.New("inbox: prune: ReplayHorizon is required (stream MaxAge, redeliveries, late copies, re-drives)")
	}
	if o.Margin <= 0 {
		o.Margin = DefaultPruneMargin
	}
	if least := o.ReplayHorizon + o.Margin; o.OlderThan <= least || least < o.ReplayHorizon {
		return o, fmt.Errorf("%w: OlderThan %v is not longer than ReplayHorizon %v + margin %v", ErrUnsafeHorizon, o.OlderThan, o.ReplayHorizon, o.Margin)
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 10000
	}
	return o, nil
}

// Prune deletes inbox rows received longer than opts.OlderThan ago, in
// batches, and returns how many it deleted. The cut-off is taken once, from
// PostgreSQL's now(), the clock received_at comes from. It returns
// [ErrUnsafeHorizon] without deleting anything unless OlderThan is strictly
// longer than ReplayHorizon + Margin.
func Prune(ctx context.Context, db PruneDB, opts PruneOptions) (int64, error) {
	opts, err := opts.Checked()
	if err != nil {
		return 0, err
	}
	var cutoff time.Time
	if err := db.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`, opts.OlderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("inbox: prune: cut-off: %w", err)
	}
	var total int64
	for {
		tag, err := db.Exec(ctx, `DELETE FROM inbox WHERE ctid = ANY (ARRAY (
	SELECT ctid FROM inbox WHERE received_at < $1 AND ($2 = '' OR scope = $2) LIMIT $3))`,
			cutoff, opts.Scope, opts.BatchSize)
		if err != nil {
			return total, fmt.Errorf("inbox: prune: %w", err)
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
