// Package pginbox keeps the inbox in PostgreSQL through pgx: the
// production store, with a COPY fast path for big batches of first
// deliveries.
//
//	pool, err := pginbox.NewPool(ctx, url) // or WatchCommits on a pgxpool.Config of your own
//	if err != nil {
//		return err
//	}
//	store := pginbox.New(pool)
//	if err := store.CheckSchema(ctx); err != nil { // `jetinbox migrate` or store.Migrate made it
//		return err
//	}
//	proc, err := inbox.NewProcessor(store, inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
//		_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1)`, m.ID)
//		return err
//	}), inbox.Config{Scope: "shipping"})
//
// One [Store] value carries everything of the database: the processor's
// claims and transactions, [Store.Migrate], [Store.MigrationSQL],
// [Store.MigrationStatus], [Store.CheckSchema], [Store.Prune] and
// [Store.Ping]. [ClaimTx] claims a batch inside a transaction of your own.
//
// # Commits the synchronous standby never confirmed
//
// With a synchronous standby, a COMMIT whose wait for the standby is
// cancelled (pg_cancel_backend, a cancel request) stays committed on the
// primary and returns success with only a warning, which pgx hands to the
// connection's OnNotice and to no one else. [WatchCommits] (or
// [NewPool]) installs a handler there, chained with any the configuration
// has; the store then reports such a commit as [ErrCommitNotReplicated]
// and the processor acks nothing of the batch. [Store.CheckCommitWatch]
// (and [Store.Warm]) tell a pool made without it.
//
// # Roles
//
// A processor needs no DELETE on the inbox: the claim of a message whose
// effect failed for a passing reason is given back through the function
// inbox_release, which removes only rows the calling transaction inserted
// itself (those whose claim_xid, filled by the column's default, is that
// transaction's ID). The role that processes messages needs SELECT on
// inbox; INSERT on its columns scope, message_id, fingerprint, stream_seq
// and subject; UPDATE of status and reason (never of claim_xid, nor INSERT
// of it); EXECUTE on inbox_release; and INSERT on inbox_conflicts with
// SELECT of its key columns (deploy/postgres/grants.sql). [Store.Prune]
// needs DELETE and is best run under a role of its own.
package pginbox

import (
	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox/driver"
)

var _ driver.Store[pgx.Tx] = (*Store)(nil)
