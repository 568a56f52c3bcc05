package inbox

import (
	"context"
	"errors"
)

// Store is the database a [Processor] keeps its inbox in: the seam
// between the processor, which decides what happens to each message, and
// the SQL that makes it durable. TX is the transaction type the store's
// handlers get and apply their effects in.
//
// Do not implement Store: its methods are the processor's internals and
// may change in any release, as a driver interface does (riverdriver in
// River says the same). Use one of the two stores this module ships; one
// conformance suite (internal) runs the same guarantee tests, crash
// points and mutations on both:
//
//   - package [github.com/jetinbox/jetinbox/inbox/pginbox]: PostgreSQL
//     through pgx (TX is pgx.Tx), the production store, with a COPY fast
//     path for big batches of first deliveries.
//   - package [github.com/jetinbox/jetinbox/inbox/sqliteinbox]: SQLite
//     through database/sql (TX is *sql.Tx), for a worker that keeps its
//     inbox in a local file.
//
// Every method that takes a tx runs inside the batch's transaction; the
// processor begins it, claims, applies, records and commits, and rolls it
// back on any error. A store must make two transactions that claim the same
// (scope, ID) serialize: the second sees the first's row once it committed,
// or claims the ID itself if the first rolled back.
type Store[TX any] interface {
	// Begin starts the transaction of one batch.
	Begin(ctx context.Context) (TX, error)
	// Commit commits tx. An error for which [Store.CommitRolledBack]
	// is false leaves the outcome unknown: the batch is then never acked.
	Commit(ctx context.Context, tx TX) error
	// Rollback rolls tx back; after Commit it is a no-op.
	Rollback(ctx context.Context, tx TX) error
	// CommitRolledBack reports whether a Commit error says the
	// transaction certainly did not commit.
	CommitRolledBack(err error) bool

	// Claim claims every claim for scope, in order, reporting each as
	// fresh, duplicate or conflict; copies of an ID earlier in the slice
	// are resolved as pginbox.ClaimTx does. Claims have valid IDs.
	Claim(ctx context.Context, tx TX, scope string, claims []Claim) ([]ClaimResult, error)
	// ClaimNewThreshold is the smallest batch of first deliveries the
	// store claims with ClaimNew; 0 if it has no such fast path.
	ClaimNewThreshold() int
	// ClaimNew inserts claims that are all expected to be new (order
	// lists their indexes sorted by ID, every ID once). It succeeds only
	// if every row is new; if some ID is there already it returns an
	// error wrapping [ErrClaimedBefore] and tx is unusable.
	ClaimNew(ctx context.Context, tx TX, scope string, claims []Claim, order []int) error

	// Savepoint runs one savepoint statement on tx: "SAVEPOINT name",
	// "ROLLBACK TO SAVEPOINT name" or "RELEASE SAVEPOINT name".
	Savepoint(ctx context.Context, tx TX, stmt string) error
	// MarkRejected sets the status of the rows of ids (claimed in tx) to
	// rejected, with reasons[i] as ids[i]'s reason.
	MarkRejected(ctx context.Context, tx TX, scope string, ids, reasons []string) error
	// ReleaseClaims removes the rows of ids claimed in tx, so that their
	// messages are claimed again on the next delivery. Every one of them
	// was claimed fresh in tx: if any row is not removed, it returns an
	// error and the batch fails, since a row left behind would make the
	// redelivery a duplicate acked without its effect.
	ReleaseClaims(ctx context.Context, tx TX, scope string, ids []string) error
	// RecordConflicts keeps each message whose ID was claimed before with
	// another fingerprint, once per (scope, ID, stream sequence).
	RecordConflicts(ctx context.Context, tx TX, scope string, conflicts []Claim) error

	// Classify says what an error of a store statement, or of a handler
	// running on the store's transaction, means for the batch.
	Classify(err error) ErrorKind
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
	// Check runs a transaction that fails where a batch would fail for
	// the database's or the deployment's reason: the database unreachable,
	// the inbox schema missing or older than this library
	// ([ErrNotMigrated]), a session that cannot write, a connection that
	// cannot hold a transaction (a pooler in statement mode), a grant the
	// claim needs missing (the last three wrap [ErrDatabaseUnfit]). A
	// consumer refuses to start on the latter two kinds and, after a batch
	// failed so, pauses until Check passes.
	Check(ctx context.Context) error
	// Warm readies the store for up to n concurrent batches (opening
	// connections, preparing statements) and calls prepare on each
	// readied transaction; see [Processor.Warm].
	Warm(ctx context.Context, n int, prepare func(ctx context.Context, tx TX) error) error
}

// ErrorKind is what a database error means for a batch.
type ErrorKind uint8

// The kinds of errors a [Store] tells apart.
const (
	// ErrorOther: the statement failed; the transaction may be unusable.
	ErrorOther ErrorKind = iota
	// ErrorRetryTx: a deadlock, a serialization failure or a lock that
	// stayed busy; the whole transaction succeeds on a retry.
	ErrorRetryTx
	// ErrorData: the input itself is at fault (a data exception, an
	// integrity violation): the same statement fails again.
	ErrorData
	// ErrorConn: the connection, the database or the deployment is at
	// fault, not one message: the connection or the server is gone, the
	// node is read-only, a table, function or grant is missing, a pooler
	// refuses the transaction. The batch is retried as a whole and no
	// message is rejected for it, on its last delivery either.
	ErrorConn
)

// ErrDatabaseUnfit is wrapped by a store's Check when the database answers
// but cannot take batches as it is set up: the session is read-only, the
// connection cannot hold a transaction, or the role lacks a grant the claim
// needs. An operator must change the deployment; no retry helps before.
var ErrDatabaseUnfit = errors.New("inbox: the database cannot take batches as it is set up")

// ErrClaimedBefore is wrapped by [Store.ClaimNew] when an ID it was to
// insert is already in the inbox.
var ErrClaimedBefore = errors.New("inbox: fast claim met an existing ID")
