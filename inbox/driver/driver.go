// Package driver is the seam between [inbox.Processor] and the two stores
// this module ships, [pginbox] and [sqliteinbox]: the interface a store
// implements and the values that cross it.
//
// It is not for users. Its names may change in any release, as a database
// driver interface does (riverdriver in River says the same): a worker
// calls inbox.NewProcessor with pginbox.New(pool) or sqliteinbox.New(db)
// and never names anything here. The one exception is
// pginbox.ClaimTx, a claim inside a transaction of your own, which takes
// [Claim] values and returns [ClaimResult] values.
//
// [inbox.Processor]: https://pkg.go.dev/github.com/jetinbox/jetinbox/inbox#Processor
// [pginbox]: https://pkg.go.dev/github.com/jetinbox/jetinbox/inbox/pginbox
// [sqliteinbox]: https://pkg.go.dev/github.com/jetinbox/jetinbox/inbox/sqliteinbox
package driver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
)

// Store is the database an [inbox.Processor] keeps its inbox in: the seam
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
	// (inbox.ErrNotMigrated), a session that cannot write, a connection that
	// cannot hold a transaction (a pooler in statement mode), a grant the
	// claim needs missing (the last three wrap inbox.ErrDatabaseUnfit). A
	// consumer refuses to start on the latter two kinds and, after a batch
	// failed so, pauses until Check passes.
	Check(ctx context.Context) error
	// Warm readies the store for up to n concurrent batches (opening
	// connections, preparing statements) and calls prepare on each
	// readied transaction; see inbox.Processor.Warm.
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

// ErrClaimedBefore is wrapped by [Store.ClaimNew] when an ID it was to
// insert is already in the inbox.
var ErrClaimedBefore = errors.New("inbox: fast claim met an existing ID")

// Claim is one message to claim: its identity, its payload's fingerprint
// and its subject.
type Claim struct {
	ID          string
	Fingerprint [32]byte
	// Subject is part of the intent's identity: a repeat of an ID must
	// match it as well as the payload, or it is a conflict (an effect that
	// routes by subject would otherwise never see the second one). Empty
	// when the transport has none.
	Subject string
	// StreamSeq is stored with the row for operators. Optional.
	StreamSeq uint64
}

// SameIntent reports whether a stored row's fingerprint and subject are
// those of c: a repeat of the same intent, not a reuse of its ID.
func (c *Claim) SameIntent(fingerprint []byte, subject string) bool {
	return bytes.Equal(fingerprint, c.Fingerprint[:]) && subject == c.Subject
}

// ClaimState says whether a claim is new.
type ClaimState uint8

// The states a claim can end in.
const (
	// ClaimFresh: the row is new in this transaction; apply the effect in
	// the same transaction.
	ClaimFresh ClaimState = iota + 1
	// ClaimDuplicate: the row existed with the same fingerprint (or the ID
	// appeared earlier in the same call). Do nothing.
	ClaimDuplicate
	// ClaimConflict: the row existed with a different fingerprint (or the ID
	// appeared earlier in the same call with a different one). Do not apply.
	ClaimConflict
)

// String returns the state's name: fresh, duplicate or conflict.
func (s ClaimState) String() string {
	switch s {
	case ClaimFresh:
		return "fresh"
	case ClaimDuplicate:
		return "duplicate"
	case ClaimConflict:
		return "conflict"
	}
	return fmt.Sprintf("ClaimState(%d)", uint8(s))
}

// RowStatus is an inbox row's status, as its status column stores it.
type RowStatus string

// The statuses an inbox row can have.
const (
	// RowApplied: the message's effect committed with the row.
	RowApplied RowStatus = "applied"
	// RowRejected: the message can never be applied; the row's reason says
	// why.
	RowRejected RowStatus = "rejected"
)

// ClaimResult is the result of one claim.
type ClaimResult struct {
	State ClaimState
	// PriorStatus and PriorReason are the stored row's status and reason,
	// for duplicates and conflicts found in the table; PriorStatus is empty
	// otherwise.
	PriorStatus RowStatus
	PriorReason string
	// PriorSeq is the stored row's stream sequence: the message that
	// claimed it (0 if it was not given).
	PriorSeq uint64
	// PriorSubject is the stored row's subject, for duplicates and
	// conflicts found in the table.
	PriorSubject string
	// InBatch is true when the duplicate or conflict was with an earlier
	// claim of the same call rather than with a stored row; First is that
	// claim's index. Such a claim shares the first one's fate: if the first
	// is not committed, neither is this one.
	InBatch bool
	First   int
}
