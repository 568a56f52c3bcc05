// Package outbox keeps the messages a transaction emits effectively once: a
// handler's follow-up intents, and a service's own database write plus the
// intent that announces it.
//
//	st := pginbox.New(pool)             // the consumer's store; or pgoutbox.New(pool) in a service
//	ob := st.Outbox()                   // the outbox in the same database
//	_, err := ob.Migrate(ctx)           // a deploy step: `jetinbox migrate`
//	err = pgoutbox.Add(ctx, tx, intent) // in the effect's own transaction
//	relay, err := outbox.NewRelay(ob, js, outbox.RelayConfig{Stream: "INTENTS"})
//	err = relay.Run(ctx)
//
// This package holds what does not depend on the database: the [Relay], the
// [Source] it takes rows from, [FollowUpID], the errors and [PruneOptions].
// Packages pgoutbox and sqliteoutbox hold the stores.
//
// Publishing after COMMIT loses the message when the process dies in between;
// publishing before COMMIT sends a message for an effect that may roll back.
// Instead, a store's Add (pgoutbox.Add, sqliteoutbox.Add) writes the
// message to the outbox table in the same transaction as the effect (the inbox row and ledger entry of a handler, the
// order row of a service), so both commit or neither does. A [Relay] then
// publishes pending rows to JetStream with Nats-Msg-Id = the row's ID, waits
// for the PubAck, and marks them sent.
//
// Every step can repeat without a second effect. A follow-up's ID is derived
// from its parent's with [FollowUpID], so a redelivered or replayed parent
// emits the same ID and payload, and the inbox of the parent stops it from
// running twice anyway. A relay that dies after publishing and before marking
// publishes the row again with the same ID: the stream drops the copy inside
// its duplicate window, and the next inbox drops it after. Add refuses an ID
// it holds with another payload ([inbox.ErrConflict]): a second attempt can send
// neither a second message nor a different one.
//
// # Relays
//
// Several relays may run at once (in every consumer, or as `jetinbox relay`).
// On PostgreSQL each takes a batch of pending rows with SELECT … FOR UPDATE SKIP LOCKED, so
// they share the work without a leader and never publish a row at the same
// time; the row locks of a relay that dies go with its connection. A relay
// sleeps until PostgreSQL notifies it of new rows (LISTEN jetinbox_outbox;
// the table's trigger sends the notification at COMMIT), with a jittered
// poll as a safety net for a lost listener connection, and backs off with
// jitter after errors. On SQLite a relay leases its batch instead (see
// sqliteoutbox).
//
// # Retention
//
// Sent rows stay so that Add can recognise a repeat; a store's Prune
// deletes those older than a horizon, with the inbox's rule: strictly longer than the time
// over which the same work can be attempted again, plus a margin. Pending
// rows are never deleted.
package outbox
