package pginbox

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

	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/internal/pgwatch"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// DB is the database a [Store] runs on. *pgxpool.Pool and *pgx.Conn
// satisfy it; a pool is what a worker with concurrent batches wants.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Ping(ctx context.Context) error
}

// Store is the PostgreSQL inbox: the [driver.Store] a processor runs on
// (its handlers get a pgx.Tx), and the schema, retention and health
// checks of the same database. Make one with [New] and pass it to
// [inbox.NewProcessor]; everything else that needs the database (a
// consumer's pause during an outage) takes it from the processor.
//
// Its methods Begin, Commit, Rollback, CommitRolledBack, Claim,
// ClaimNewThreshold, ClaimNew, Savepoint, MarkRejected, ReleaseClaims,
// RecordConflicts, Classify and Warm are the driver.Store seam the
// processor calls; they are not for users. What a user calls: New,
// Migrate, MigrationSQL, MigrationStatus, CheckSchema, Check, Ping, Prune.
type Store struct {
	db DB
	// claim is ClaimTx; tests plant a broken one (export_test.go).
	claim func(ctx context.Context, tx pgx.Tx, scope string, claims []driver.Claim) ([]driver.ClaimResult, error)
	// claimCopy is the COPY claim; noCopy turns it off. Tests plant a
	// broken claim or compare both paths through them (export_test.go).
	claimCopy func(ctx context.Context, tx pgx.Tx, scope string, claims []driver.Claim, order []int) error
	noCopy    bool
}

// New returns the PostgreSQL store on db, a *pgxpool.Pool or a *pgx.Conn.
func New(db DB) *Store {
	return &Store{db: db, claim: ClaimTx, claimCopy: claimCopy}
}

// DB returns the database the store runs on.
func (s *Store) DB() DB { return s.db }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.Ping(ctx) }

func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) { return s.db.Begin(ctx) }

// Commit commits tx. A COMMIT the server answers with success and the
// warning that its wait for the synchronous standby was cancelled
// returns an error wrapping [ErrCommitNotReplicated]: the processor
// treats it as an unknown outcome and acks nothing. It sees that warning
// only on connections made with [WatchCommits].
func (s *Store) Commit(ctx context.Context, tx pgx.Tx) error { return pgwatch.Commit(ctx, tx) }

// ReadPriorCommits makes the commit of a transaction that wrote nothing
// wait, as a writing one does, until every commit before it is as durable
// as a fresh one (flushed, and confirmed by the synchronous standby). A
// transaction ID alone does not do it: PostgreSQL commits a transaction
// that wrote no WAL without flushing or waiting for the standby, even
// with an ID. So it writes an empty transactional logical-decoding
// message (prefix "jetinbox.durable", seen only by logical decoding
// consumers, which may ignore it), which takes an ID and WAL: the
// COMMIT then writes its record, flushes and waits for the standby to
// confirm all WAL up to it. The processor calls it before committing a
// batch that acks duplicates and claimed nothing: a duplicate rests on a
// row committed earlier, perhaps by a commit whose wait for the standby
// was cancelled.
func (s *Store) ReadPriorCommits(ctx context.Context, tx pgx.Tx) error {
	return pgwatch.ReadPriorCommits(ctx, tx)
}

func (s *Store) Rollback(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }

// CommitRolledBack: a COMMIT the server answered with an error, or that
// pgx reports as a rollback, did not commit; anything else (a broken
// connection, a commit only the primary has: [ErrCommitNotReplicated])
// may have.
func (s *Store) CommitRolledBack(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback)
}

func (s *Store) Claim(ctx context.Context, tx pgx.Tx, scope string, claims []driver.Claim) ([]driver.ClaimResult, error) {
	return s.claim(ctx, tx, scope, claims)
}

func (s *Store) ClaimNewThreshold() int {
	if s.noCopy {
		return 0
	}
	return copyClaimThreshold
}

func (s *Store) ClaimNew(ctx context.Context, tx pgx.Tx, scope string, claims []driver.Claim, order []int) error {
	return s.claimCopy(ctx, tx, scope, claims, order)
}

func (s *Store) Savepoint(ctx context.Context, tx pgx.Tx, stmt string) error {
	_, err := tx.Exec(ctx, stmt)
	return err
}

func (s *Store) MarkRejected(ctx context.Context, tx pgx.Tx, scope string, rejIDs, rejReasons []string) error {
	_, err := tx.Exec(ctx, `UPDATE inbox SET status = 'rejected', reason = t.reason
FROM unnest($2::text[], $3::text[]) AS t(id, reason)
WHERE inbox.scope = $1 AND inbox.message_id = t.id`, scope, rejIDs, rejReasons)
	return err
}

func (s *Store) ReleaseClaims(ctx context.Context, tx pgx.Tx, scope string, retryIDs []string) error {
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

func (s *Store) RecordConflicts(ctx context.Context, tx pgx.Tx, scope string, conflicts []driver.Claim) error {
	// In ID order, like the claims: two processes recording the same
	// conflicts cannot deadlock.
	conflicts = slices.Clone(conflicts)
	slices.SortFunc(conflicts, func(a, b driver.Claim) int { return strings.Compare(a.ID, b.ID) })
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

func (s *Store) Classify(err error) driver.ErrorKind {
	switch {
	case isRetryableTx(err):
		return driver.ErrorRetryTx
	case isDataError(err):
		return driver.ErrorData
	case isConnError(err):
		return driver.ErrorConn
	}
	return driver.ErrorOther
}

// Warm opens n transactions at once, so that a pool opens n connections,
// prepares the claim statements and calls prepare on each, and rolls them
// back. n is capped at a pool's MaxConns, and is 1 for a single
// connection. It then checks, as [Store.CheckCommitWatch], that the
// connections were made with [WatchCommits]. Statements are prepared only where the connection caches them
// anyway (pgx's default mode).
func (s *Store) Warm(ctx context.Context, n int, prepare func(ctx context.Context, tx pgx.Tx) error) error {
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
	if first != nil {
		return first
	}
	// Last, so that the connections are ready either way: a pool that
	// cannot see a commit the standby never confirmed is said at start.
	if err := s.CheckCommitWatch(ctx); err != nil {
		return fmt.Errorf("inbox: warm: %w", err)
	}
	return nil
}

func (s *Store) prepare(ctx context.Context, tx pgx.Tx, prepare func(ctx context.Context, tx pgx.Tx) error) error {
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

// Outbox returns the outbox store on the same database: its Migrate,
// CheckSchema, Prune and Backlog, and the source a relay takes rows from
// (outbox.NewRelay(st.Outbox(), js, cfg)). Its table is migrated apart from
// the inbox's, by its own Migrate: a worker that emits nothing needs no
// outbox table.
func (s *Store) Outbox() *pgoutbox.Store { return pgoutbox.New(s.db) }
