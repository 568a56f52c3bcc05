package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres returns the PostgreSQL store on db (a *pgxpool.Pool, a
// *pgx.Conn, or any [Beginner]): the production store. Its handlers get a
// pgx.Tx. [NewProcessor] uses it.
func Postgres(db Beginner) Store[pgx.Tx] {
	return &pgStore{db: db, claim: ClaimTx, claimCopy: claimCopy}
}

// pgStore is the PostgreSQL [Store].
type pgStore struct {
	db Beginner
	// claim is ClaimTx; tests plant a broken one (export_test.go).
	claim func(ctx context.Context, tx pgx.Tx, scope string, claims []Claim) ([]ClaimResult, error)
	// claimCopy is the COPY claim; noCopy turns it off. Tests plant a
	// broken claim or compare both paths through them (export_test.go).
	claimCopy func(ctx context.Context, tx pgx.Tx, scope string, claims []Claim, order []int) error
	noCopy    bool
}

func (s *pgStore) Begin(ctx context.Context) (pgx.Tx, error) { return s.db.Begin(ctx) }

func (s *pgStore) Commit(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }

func (s *pgStore) Rollback(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }

// CommitRolledBack: a COMMIT the server answered with an error, or that
// pgx reports as a rollback, did not commit; anything else (a broken
// connection) may have.
func (s *pgStore) CommitRolledBack(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback)
}

func (s *pgStore) Claim(ctx context.Context, tx pgx.Tx, scope string, claims []Claim) ([]ClaimResult, error) {
	return s.claim(ctx, tx, scope, claims)
}

func (s *pgStore) ClaimNewThreshold() int {
	if s.noCopy {
		return 0
	}
	return copyClaimThreshold
}

func (s *pgStore) ClaimNew(ctx context.Context, tx pgx.Tx, scope string, claims []Claim, order []int) error {
	return s.claimCopy(ctx, tx, scope, claims, order)
}

func (s *pgStore) Savepoint(ctx context.Context, tx pgx.Tx, stmt string) error {
	_, err := tx.Exec(ctx, stmt)
	return err
}

func (s *pgStore) MarkRejected(ctx context.Context, tx pgx.Tx, scope string, rejIDs, rejReasons []string) error {
	_, err := tx.Exec(ctx, `UPDATE inbox SET status = 'rejected', reason = t.reason
FROM unnest($2::text[], $3::text[]) AS t(id, reason)
WHERE inbox.scope = $1 AND inbox.message_id = t.id`, scope, rejIDs, rejReasons)
	return err
}

func (s *pgStore) ReleaseClaims(ctx context.Context, tx pgx.Tx, scope string, retryIDs []string) error {
	// inbox_release (migrations 0002 and 0003) removes only rows this
	// transaction inserted (their claim_xid, which only the column's
	// default writes, is its ID), so the claiming role needs no DELETE on
	// inbox. Every
	// retried message was claimed fresh in this transaction: a row it
	// did not remove would make the redelivery a duplicate, acked without
	// its effect, so a short count fails the batch instead.
	var n int64
	if err := tx.QueryRow(ctx, `SELECT inbox_release($1, $2::text[])`, scope, retryIDs).Scan(&n); err != nil {
		return err
	}
	if n != int64(len(retryIDs)) {
		return fmt.Errorf("released %d of %d", n, len(retryIDs))
	}
	return nil
}

func (s *pgStore) RecordConflicts(ctx context.Context, tx pgx.Tx, scope string, conflicts []Claim) error {
	// In ID order, like the claims: two processes recording the same
	// conflicts cannot deadlock.
	conflicts = slices.Clone(conflicts)
	slices.SortFunc(conflicts, func(a, b Claim) int { return strings.Compare(a.ID, b.ID) })
	ids := make([]string, len(conflicts))
	fps := make([][]byte, len(conflicts))
	seqs := make([]int64, len(conflicts))
	subjects := make([]string, len(conflicts))
	for k := range conflicts {
		c := &conflicts[k]
		ids[k], fps[k], seqs[k], subjects[k] = c.ID, c.Fingerprint[:], int64(c.StreamSeq), c.Subject
	}
	_, err := tx.Exec(ctx, `INSERT INTO inbox_conflicts (scope, message_id, fingerprint, stream_seq, subject)
SELECT $1, * FROM unnest($2::text[], $3::bytea[], $4::bigint[], $5::text[])
ON CONFLICT (scope, message_id, stream_seq) DO NOTHING`, scope, ids, fps, seqs, subjects)
	return err
}

func (s *pgStore) Classify(err error) ErrorKind {
	switch {
	case isRetryableTx(err):
		return ErrorRetryTx
	case isDataError(err):
		return ErrorData
	case isConnError(err):
		return ErrorConn
	}
	return ErrorOther
}

// Warm opens n transactions at once, so that a pool opens n connections,
// prepares the claim statements and calls prepare on each, and rolls them
// back. n is capped at a pool's MaxConns, and is 1 for a single
// connection. Statements are prepared only where the connection caches them
// anyway (pgx's default mode).
func (s *pgStore) Warm(ctx context.Context, n int, prepare func(ctx context.Context, tx pgx.Tx) error) error {
	switch db := s.db.(type) {
	case *pgx.Conn:
		n = 1
	case interface{ Stat() *pgxpool.Stat }:
		n = min(n, int(db.Stat().MaxConns()))
	}
	n = max(n, 1)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var ready sync.WaitGroup
	ready.Add(n)
	all := make(chan struct{})
	errs := make(chan error, n)
	for range n {
		go func() {
			tx, err := s.db.Begin(ctx)
			if err != nil {
				ready.Done()
				errs <- fmt.Errorf("inbox: warm: %w", err)
				return
			}
			err = s.prepare(ctx, tx, prepare)
			// Hold the transaction until all have begun, so the pool
			// cannot hand one connection out n times.
			ready.Done()
			<-all
			_ = tx.Rollback(context.WithoutCancel(ctx))
			errs <- err
		}()
	}
	ready.Wait()
	close(all)
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (s *pgStore) prepare(ctx context.Context, tx pgx.Tx, prepare func(ctx context.Context, tx pgx.Tx) error) error {
	if tx.Conn().Config().DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return nil
	}
	for _, sql := range []string{claimSQL, existingSQL} {
		if _, err := tx.Prepare(ctx, sql, sql); err != nil {
			return fmt.Errorf("inbox: warm: %w", err)
		}
	}
	return prepare(ctx, tx)
}
