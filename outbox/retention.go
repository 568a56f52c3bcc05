package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
)

// PruneOptions configures [Prune].
type PruneOptions struct {
	// OlderThan deletes sent rows created more than this long ago, by
	// PostgreSQL's clock (created_at and the cut-off both come from its
	// now()). It must be strictly longer than ReplayHorizon + Margin.
	// Required.
	OlderThan time.Duration
	// ReplayHorizon is the longest time after a row was written that the
	// same work can run again and add the same ID: for follow-ups, the
	// horizon of the stream their parents come from (the inbox's, see
	// inbox.PruneOptions); for a service's own writes, how long it may
	// retry a request. A row pruned inside it lets a repeat be added, and
	// published, again. Required.
	ReplayHorizon time.Duration
	// Margin is added to ReplayHorizon before comparing. Default
	// [inbox.DefaultPruneMargin].
	Margin time.Duration
	// BatchSize is how many rows one DELETE removes. Default 10000.
	BatchSize int
}

// CheckPrune fills the defaults of opts (Margin, BatchSize) and refuses
// what [Prune] refuses: no ReplayHorizon, or an OlderThan that is not
// strictly longer than ReplayHorizon + Margin (an error wrapping
// [inbox.ErrUnsafeHorizon]). A store of its own calls it before deleting.
func CheckPrune(opts *PruneOptions) error {
	if opts.ReplayHorizon <= 0 {
		return errors.New("outbox: prune: ReplayHorizon is required (how long the same work can add the same ID again)")
	}
	if opts.Margin <= 0 {
		opts.Margin = inbox.DefaultPruneMargin
	}
	if least := opts.ReplayHorizon + opts.Margin; opts.OlderThan <= least || least < opts.ReplayHorizon {
		return fmt.Errorf("outbox: prune: %w: OlderThan %v is not longer than ReplayHorizon %v + margin %v", inbox.ErrUnsafeHorizon, opts.OlderThan, opts.ReplayHorizon, opts.Margin)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 10000
	}
	return nil
}

// Prune deletes sent outbox rows created longer than opts.OlderThan ago, in
// batches, and returns how many it deleted. Pending rows and rows marked
// failed are never deleted. It returns an error wrapping
// [inbox.ErrUnsafeHorizon], deleting nothing, unless OlderThan is strictly
// longer than ReplayHorizon + Margin.
func Prune(ctx context.Context, db PruneDB, opts PruneOptions) (int64, error) {
	if err := CheckPrune(&opts); err != nil {
		return 0, err
	}
	var cutoff time.Time
	if err := queryRow(ctx, db, `SELECT now() - $1::bigint * interval '1 microsecond'`, []any{opts.OlderThan.Microseconds()}, &cutoff); err != nil {
		return 0, fmt.Errorf("outbox: prune: cut-off: %w", err)
	}
	var total int64
	for {
		tag, err := db.Exec(ctx, `DELETE FROM outbox WHERE ctid = ANY (ARRAY (
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
func Backlog(ctx context.Context, db Querier) (int64, time.Duration, error) {
	var n int64
	var oldest float64
	if err := queryRow(ctx, db, `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM outbox WHERE sent_at IS NULL AND failed IS NULL`, nil, &n, &oldest); err != nil {
		return 0, 0, fmt.Errorf("outbox: backlog: %w", err)
	}
	return n, time.Duration(oldest * float64(time.Second)), nil
}
