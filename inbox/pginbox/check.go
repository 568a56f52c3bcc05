package pginbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/pgwatch"
)

// Check implements [driver.Store]: one transaction that fails where a batch
// would fail for the database's or the deployment's reason, and rolls
// back. In it:
//
//   - the inbox migrations this library ships are applied
//     ([inbox.ErrNotMigrated] otherwise);
//   - the session can write (transaction_read_only is off: a standby, a
//     database or role set default_transaction_read_only, or a verifier's
//     session, are refused);
//   - the connection holds the transaction: a pooler in statement mode
//     refuses the BEGIN (08P01), and two statements of one transaction
//     run on one server backend;
//   - the role may claim: SELECT, INSERT and UPDATE on inbox, INSERT on
//     inbox_conflicts, EXECUTE on inbox_release;
//   - on a server that waits for a synchronous standby, the pool was made
//     with [WatchCommits] (or [NewPool]), so that a COMMIT whose wait was
//     cancelled is never taken for a durable one.
//
// The last four wrap [inbox.ErrDatabaseUnfit]; an unreachable database
// fails with the driver's error.
func (s *Store) Check(ctx context.Context) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return checkError("begin a transaction", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := checkSchema(ctx, tx); err != nil {
		return err
	}
	if err := checkSession(ctx, tx); err != nil {
		return err
	}
	if err := checkGrants(ctx, tx); err != nil {
		return err
	}
	return checkWatch(ctx, tx)
}

// checkWatch refuses a pool made without [WatchCommits] on a server that
// waits for a synchronous standby: there a COMMIT whose wait is cancelled
// returns success with only a warning, which such a pool cannot see, and
// its batch would be acked on a commit the standby may lack. Without a
// synchronous standby the pool is let through (the consumer's warm-up
// logs [ErrCommitsUnwatched] still): nothing waits, nothing is cancelled.
func checkWatch(ctx context.Context, tx pgx.Tx) error {
	if pgwatch.Watched(tx) {
		return nil
	}
	var names string
	if err := tx.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names')`).Scan(&names); err != nil {
		return checkError("read synchronous_standby_names", err)
	}
	if strings.TrimSpace(names) == "" {
		return nil
	}
	return fmt.Errorf("%w: the server waits for a synchronous standby (synchronous_standby_names = %q), and this pool cannot see a COMMIT whose wait was cancelled, "+
		"which PostgreSQL answers with success and a warning: make the pool with pginbox.NewPool, or call pginbox.WatchCommits on its configuration", inbox.ErrDatabaseUnfit, names)
}

// CheckSession is the part of [Store.Check] that any writer needs, with no
// table of its own: the session can write and the connection holds a
// transaction. Its errors wrap [inbox.ErrDatabaseUnfit], or are the
// driver's for an unreachable database.
func (s *Store) CheckSession(ctx context.Context) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return checkError("begin a transaction", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	return checkSession(ctx, tx)
}

// checkSession checks in tx that the session may write and that two
// statements run on one server backend.
func checkSession(ctx context.Context, tx pgx.Tx) error {
	var readOnly string
	var pid1, pid2 uint32
	if err := tx.QueryRow(ctx, `SELECT current_setting('transaction_read_only'), pg_backend_pid()`).Scan(&readOnly, &pid1); err != nil {
		return checkError("read the session's settings", err)
	}
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid2); err != nil {
		return checkError("read the session's backend", err)
	}
	switch {
	case readOnly != "off":
		return fmt.Errorf("%w: the session is read-only (transaction_read_only is %s): a standby, or default_transaction_read_only set for the database or the role; "+
			"point the database URL at the primary (target_session_attrs=read-write) with a role that may write", inbox.ErrDatabaseUnfit, readOnly)
	case pid1 != pid2:
		return fmt.Errorf("%w: two statements of one transaction ran on two server backends (%d, %d): a connection pooler that does not keep a transaction on one "+
			"server connection answers; use transaction or session pooling", inbox.ErrDatabaseUnfit, pid1, pid2)
	}
	return nil
}

// releaseSignature is the function a retried claim goes back through.
const releaseSignature = "inbox_release(text, text[])"

// checkGrants checks in tx that the role may claim, reject, record
// conflicts and release claims.
func checkGrants(ctx context.Context, tx pgx.Tx) error {
	var canSelect, canInsert, canUpdate, canConflict, canRelease bool
	if err := tx.QueryRow(ctx, `SELECT has_table_privilege('inbox', 'SELECT'),
	has_any_column_privilege('inbox', 'INSERT'),
	has_any_column_privilege('inbox', 'UPDATE'),
	has_any_column_privilege('inbox_conflicts', 'INSERT'),
	coalesce(has_function_privilege(to_regprocedure($1), 'EXECUTE'), false)`, releaseSignature).Scan(&canSelect, &canInsert, &canUpdate, &canConflict, &canRelease); err != nil {
		return checkError("read the role's grants", err)
	}
	var missing []string
	for _, g := range []struct {
		ok   bool
		what string
	}{{canSelect, "SELECT on inbox"}, {canInsert, "INSERT on inbox"}, {canUpdate, "UPDATE on inbox"},
		{canConflict, "INSERT on inbox_conflicts"}, {canRelease, "EXECUTE on " + releaseSignature}} {
		if !g.ok {
			missing = append(missing, g.what)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the role lacks %s, which every batch needs: run deploy/postgres/grants.sql after the migration",
			inbox.ErrDatabaseUnfit, strings.Join(missing, ", "))
	}
	return nil
}

// checkSchema is [Store.CheckSchema] inside tx.
func checkSchema(ctx context.Context, tx pgx.Tx) error {
	ms := migrations()
	want := ms[len(ms)-1].Version
	var have int
	err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM jetinbox_migrations WHERE component = 'inbox'`).Scan(&have)
	switch code := sqlState(err); {
	case code == "42P01": // undefined_table
		return inbox.ErrNotMigrated
	case err != nil:
		return checkError("check the schema", err)
	case have < want:
		return fmt.Errorf("%w: at version %d, this library needs %d", inbox.ErrNotMigrated, have, want)
	}
	return nil
}

// checkError says what a failed step of Check means: a pooler that cannot
// hold a transaction (08P01 on BEGIN or inside one), a missing grant (42501)
// or a read-only session (25006) is the deployment's, anything else is
// returned as the driver's error (an unreachable database).
func checkError(step string, err error) error {
	switch sqlState(err) {
	case "08P01":
		return fmt.Errorf("%w: %s: the connection cannot hold a transaction (a connection pooler in statement mode?); use transaction or session pooling: %w",
			inbox.ErrDatabaseUnfit, step, err)
	case "42501":
		return fmt.Errorf("%w: %s: permission denied: run deploy/postgres/grants.sql after the migration: %w", inbox.ErrDatabaseUnfit, step, err)
	case "25006":
		return fmt.Errorf("%w: %s: the session is read-only: %w", inbox.ErrDatabaseUnfit, step, err)
	}
	if errors.Is(err, inbox.ErrNotMigrated) {
		return err
	}
	return fmt.Errorf("inbox: check: %s: %w", step, err)
}
