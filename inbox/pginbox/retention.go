package pginbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
)

// Prune deletes inbox rows received longer than opts.OlderThan ago, in
// batches, and returns how many it deleted. The cut-off is taken once, from
// PostgreSQL's now(), the clock received_at comes from. It returns
// [inbox.ErrUnsafeHorizon] without deleting anything unless OlderThan is
// strictly longer than ReplayHorizon + Margin. It needs DELETE on inbox,
// which the role that processes messages does not: run it under a role of
// its own.
func (s *Store) Prune(ctx context.Context, opts inbox.PruneOptions) (int64, error) {
	opts, err := opts.Checked()
	if err != nil {
		return 0, err
	}
	var cutoff time.Time
	if err := s.db.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`, opts.OlderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("inbox: prune: cut-off: %w", err)
	}
	var total int64
	for {
		tag, err := s.db.Exec(ctx, `DELETE FROM inbox WHERE ctid = ANY (ARRAY (
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
