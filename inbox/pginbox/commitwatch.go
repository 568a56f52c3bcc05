package pginbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/pgwatch"
)

// ErrCommitNotReplicated is wrapped by [Store.Commit] when PostgreSQL
// answered a COMMIT with success and the warning that its wait for the
// synchronous standby was cancelled (pg_cancel_backend, a pgx context
// cancellation, anything that sends a cancel request while the standby
// lags): the transaction is committed on the primary only, and a standby
// promoted now lacks it. The processor reports such a batch as
// [inbox.ErrOutcomeUnknown] and nothing of it is acked; the redelivery
// finds the rows and acks them once a commit of its own has waited for the
// standby (see [Store.ReadPriorCommits]).
var ErrCommitNotReplicated = inbox.ErrCommitNotReplicated

// ErrCommitsUnwatched is wrapped by [Store.CheckCommitWatch] for a pool
// not made with [WatchCommits].
var ErrCommitsUnwatched = inbox.ErrCommitsUnwatched

// WatchCommits sets up cfg, the connection configuration of a pool
// (pgxpool.Config.ConnConfig) or of a single connection, so that the
// store sees the warning of a COMMIT whose wait for the synchronous
// standby was cancelled, which pgx reports as a plain success. It chains
// an OnNotice handler and an AfterConnect hook onto those cfg has; an
// OnNotice set after it must call the one it replaces. Every pool a
// [Store] runs on should be made this way:
//
//	cfg, err := pgxpool.ParseConfig(url)
//	if err != nil {
//		return err
//	}
//	pginbox.WatchCommits(cfg.ConnConfig)
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
//
// On a pool made otherwise, a commit the standby never confirmed is acked
// as if it were durable; [Store.CheckCommitWatch] tells, and [Store.Warm]
// (which a consumer runs at start) fails on such a pool.
func WatchCommits(cfg *pgx.ConnConfig) { pgwatch.Install(cfg) }

// CheckCommitWatch reports an error wrapping [ErrCommitsUnwatched] unless
// the store's connections were made with [WatchCommits] and still report
// warnings to it: it raises a warning of its own and looks for it. Call
// it at start, after [Store.CheckSchema].
func (s *Store) CheckCommitWatch(ctx context.Context) error {
	if err := pgwatch.Check(ctx, s.db); err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	return nil
}

// NewPool is pgxpool.New with [WatchCommits]: a pool on connString whose
// commits the store can trust.
func NewPool(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	WatchCommits(cfg.ConnConfig)
	return pgxpool.NewWithConfig(ctx, cfg)
}
