package pgoutbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/pgwatch"
)

// ErrCommitNotReplicated is wrapped by a relay round's mark commit when
// PostgreSQL answered it with success and the warning that its wait for
// the synchronous standby was cancelled: the rows are marked sent on the
// primary only. The relay counts none of them sent; if a failover brings
// them back as pending, a relay publishes them again with the same IDs,
// which the stream's duplicate window drops (and, past it, the consumer's
// inbox acks as duplicates).
var ErrCommitNotReplicated = inbox.ErrCommitNotReplicated

// ErrCommitsUnwatched is wrapped by [Store.CheckCommitWatch] for a pool
// not made with [WatchCommits].
var ErrCommitsUnwatched = inbox.ErrCommitsUnwatched

// WatchCommits sets up cfg, the connection configuration of a pool
// (pgxpool.Config.ConnConfig) or of a connection, so that the store sees
// the warning of a COMMIT whose wait for the synchronous standby was
// cancelled, which pgx reports as a plain success. It is
// pginbox.WatchCommits: one call serves both stores on the same pool.
func WatchCommits(cfg *pgx.ConnConfig) { pgwatch.Install(cfg) }

// CheckCommitWatch reports an error wrapping [ErrCommitsUnwatched] unless
// the store's connections were made with [WatchCommits] and still report
// warnings to it. A relay calls it at start.
func (s *Store) CheckCommitWatch(ctx context.Context) error {
	if err := pgwatch.Check(ctx, s.db); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	return nil
}
