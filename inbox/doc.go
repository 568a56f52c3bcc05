// Package inbox gives at-least-once messaging effectively-once side effects:
// a consumer stores an inbox row for each message ID and the message's side
// effect in one PostgreSQL transaction, and acks only after that transaction
// committed. A redelivery finds the row and changes nothing.
//
// # The guarantee
//
// Exactly-once delivery cannot be built; this package promises less and
// keeps it:
//
//   - No duplicate effect: for every (scope, message ID) the effect is
//     applied at most once, however often the message is published,
//     redelivered, replayed or processed concurrently.
//   - No loss: every message ends applied, a duplicate of an applied one, or
//     rejected with a reason the transport dead-letters. Nothing is dropped
//     silently.
//   - Ack after commit: only an [Outcome] that is [Outcome.Ackable] may be
//     acked. A COMMIT whose outcome is unknown ([ErrOutcomeUnknown]) is never
//     ackable; the redelivery settles it either way.
//
// # Claiming inside your own transaction
//
// [ClaimTx] is the primitive: inside the caller's pgx.Tx it inserts the
// claims of a whole batch with one statement and reports each as
// [ClaimFresh], [ClaimDuplicate] or [ClaimConflict] (same ID, different
// payload fingerprint or subject). Apply the effects of the fresh ones in the same
// transaction, commit, then ack. Two transactions claiming the same ID are
// settled by PostgreSQL: the second waits on the key, then sees a duplicate
// if the first committed, or claims it if the first rolled back.
//
// # Batches
//
// A [Processor] does the whole job for a batch: one transaction, one claim
// statement, the [Handler] applies the fresh messages (set-based if it can),
// rejections and conflicts are recorded with their reasons, and it commits.
// A batch of 64 or more first deliveries is claimed with one binary COPY in
// ID order, about half the cost per row; if any ID is already there the
// transaction rolls back and the batch is claimed with [ClaimTx], so the
// outcomes are the same either way ([ProcessorStats] counts both).
// [Processor.Warm] opens and prepares connections before the first batch.
// A poison message (bad input, a [Permanent] error, a panic, a statement
// that aborts the transaction) does not take its neighbours down: the batch
// is retried one message at a time under savepoints, only when it failed.
// Deadlocks and serialization failures retry the whole batch with jittered
// backoff. Each [Outcome] carries a [Cause] that says, as a value, what
// decided it (bad input marked with [BadInput], a panic, a give-up on the
// final delivery, a conflict, ...); its Reason is the same in words.
//
// # Schema and retention
//
// The schema ships as versioned SQL. Nothing migrates implicitly: call
// [Migrate] from a deploy step, or run [MigrationSQL] with your own tool, and
// let workers call [CheckSchema] at start. [Prune] deletes old rows in
// bounded batches and refuses a horizon shorter than the time over which
// messages can come back (stream MaxAge, replays, dead-letter re-drives):
// the inbox is the real dedupe and must outlive every way back.
//
// On PostgreSQL a [Processor] needs no DELETE on the inbox: the claim of a
// message whose effect failed for a passing reason is given back through
// the function inbox_release (migrations 2 and 3), which removes only rows
// the calling transaction inserted itself: those whose claim_xid, filled by
// the column's default, is that transaction's ID. The role that processes
// messages needs SELECT on inbox; INSERT on its columns scope, message_id,
// fingerprint, stream_seq and subject; UPDATE of status and reason (never of
// claim_xid, nor INSERT of it: a role that could write it could release
// rows other transactions committed); EXECUTE on
// inbox_release; and INSERT on inbox_conflicts with SELECT of its key
// columns (deploy/postgres/grants.sql). [Prune] needs DELETE and is best run
// under a role of its own. A single owner role, as in a quick start, can do
// all of it.
//
// # Stores
//
// The processor runs on a [Store]: the seam between what happens to each
// message and the SQL that makes it durable. [Postgres] is the production
// store (pgx, with the COPY fast path); package
// [github.com/jetinbox/jetinbox/inbox/sqliteinbox] keeps the inbox in a
// SQLite file for a worker where one process and a local file will do. Both
// pass one conformance suite. [ProcessorOf], [HandlerOf] and [ConfigOf] are
// generic over the store's transaction type; [Processor], [Handler] and
// [Config] are their PostgreSQL instances, whose handlers get a pgx.Tx.
//
// # Transports
//
// Package [github.com/jetinbox/jetinbox/inbox/jsinbox] wires a Processor to
// a NATS JetStream durable pull consumer and publisher.
package inbox
