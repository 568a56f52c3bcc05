// Package inbox gives at-least-once messaging effectively-once side effects:
// a consumer stores an inbox row for each message ID and the message's side
// effect in one database transaction, and acks only after that transaction
// committed. A redelivery finds the row and changes nothing.
//
//	store := pginbox.New(pool) // or sqliteinbox.New(db); TX is pgx.Tx or *sql.Tx
//	ship := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
//		_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1)`, m.ID) // commits with the inbox row
//		return err
//	})
//	proc, err := inbox.NewProcessor(store, ship, inbox.Config{Scope: "shipping"})
//	// ...
//	consumer, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{}) // acks after COMMIT
//	err = consumer.Run(ctx)
//
// Runnable examples: the README's worker (examples/worker in the module's
// repository, a whole program), ExampleConsumer in
// internal/servertest/jsinboxtest (a worker end to end, among the tests that
// need a nats-server, kept there out of an embedder's go.sum),
// package [github.com/jetinbox/jetinbox/inbox/pginbox]'s (a batch, a claim
// inside a transaction of your own), and package
// [github.com/jetinbox/jetinbox/inboxtest]'s, which unit-tests a handler
// without NATS.
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
// # Batches
//
// A [Processor] does the whole job for a batch: one transaction, one claim
// statement, the [Handler] applies the fresh messages (set-based if it can),
// rejections and conflicts are recorded with their reasons, and it commits.
// On PostgreSQL a batch of 64 or more first deliveries is claimed with one
// binary COPY in ID order, about half the cost per row; if any ID is already
// there the transaction rolls back and the batch is claimed the careful way,
// so the outcomes are the same either way ([ProcessorStats] counts both).
// [Processor.Warm] opens and prepares connections before the first batch.
// A poison message (bad input, a [Permanent] error, a panic, a statement
// that aborts the transaction) does not take its neighbours down: the batch
// is retried one message at a time under savepoints, only when it failed.
// Deadlocks and serialization failures retry the whole batch with jittered
// backoff. Each [Outcome] carries a [Cause] that says, as a value, what
// decided it (bad input marked with [BadInput], a panic, a give-up on the
// final delivery, a conflict, ...); its Reason is the same in words.
//
// # Stores
//
// The processor runs on a store, one value per database that carries
// everything of it: the processor's claims and transactions, and Migrate,
// MigrationSQL, MigrationStatus, CheckSchema, Prune and Ping as methods.
// Package [github.com/jetinbox/jetinbox/inbox/pginbox] is the production
// store (PostgreSQL through pgx, with the COPY fast path); package
// [github.com/jetinbox/jetinbox/inbox/sqliteinbox] keeps the inbox in a
// SQLite file for a worker where one process and a local file will do.
// Both pass one conformance suite. This package imports no database
// driver. The interface the stores implement is in package
// [github.com/jetinbox/jetinbox/inbox/driver], which is not for users.
//
// Nothing migrates implicitly: call the store's Migrate from a deploy step
// (`jetinbox migrate`), or run its MigrationSQL with your own tool, and let
// workers call CheckSchema at start. Prune deletes old rows in bounded
// batches and refuses a horizon shorter than the time over which messages
// can come back ([PruneOptions]): the inbox is the real dedupe and must
// outlive every way back.
//
// # Transports
//
// Package [github.com/jetinbox/jetinbox/inbox/jsinbox] wires a Processor to
// a NATS JetStream durable pull consumer and publishes [Intent] values; the
// outbox (package [github.com/jetinbox/jetinbox/outbox]) stores the same
// Intent until its transaction commits.
package inbox
