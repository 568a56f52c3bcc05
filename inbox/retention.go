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

// PruneOptions configures [Prune].
type PruneOptions struct {
	// Scope limits pruning to one scope. Default "": every scope.
	Scope string
	// OlderThan deletes rows received more than this long ago. Required.
	OlderThan time.Duration
	// ReplayHorizon is the longest time after which a message can still come
	// back: the stream's MaxAge, how far back replays and dead-letter
	// re-drives may reach, and MaxDeliver times the longest nak delay. A row
	// pruned inside it would let a redelivery apply the effect twice, so
	// Prune refuses an OlderThan shorter than it. Required.
	ReplayHorizon time.Duration
	// BatchSize is how many rows one DELETE removes, keeping locks and WAL
	// bursts small. Default 10000.
	BatchSize int
	// Now returns the current time. Default time.Now.
	Now func() time.Time
}

// Prune deletes inbox rows older than opts.OlderThan in batches and returns
// how many it deleted. It returns [ErrUnsafeHorizon] without deleting anything
// when OlderThan is shorter than ReplayHorizon.
func Prune(ctx context.Context, db Execer, opts PruneOptions) (int64, error) {
	if opts.ReplayHorizon <= 0 {
		return 0, errors.New("inbox: prune: ReplayHorizon is required (stream MaxAge, replay and re-drive reach)")
	}
	if opts.OlderThan < opts.ReplayHorizon {
		return 0, fmt.Errorf("%w: OlderThan %v < ReplayHorizon %v", ErrUnsafeHorizon, opts.OlderThan, opts.ReplayHorizon)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 10000
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	cutoff := now().Add(-opts.OlderThan)
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
