package effects

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

//go:embed sqlite_migrations/*.sql
var sqliteMigrationFS embed.FS

// sqliteMigrations are the embedded migrations, read once.
var sqliteMigrations = migrate.Embedded(sqliteMigrationFS, "sqlite_migrations")

// MigrateSQLite creates or upgrades the ledger tables (accounts,
// ledger_entries) in a SQLite database opened with sqliteinbox.Open.
func MigrateSQLite(ctx context.Context, db *sql.DB) (int, error) {
	return migrate.ApplySQLite(ctx, db, "ledger", sqliteMigrations())
}

// MigrationSQLSQLite returns the SQLite ledger schema as one SQL script.
func MigrationSQLSQLite() string { return migrate.Script("ledger", sqliteMigrations()) }

// MigrationStatusSQLite compares the SQLite ledger migrations this package
// ships with what db recorded.
func MigrationStatusSQLite(ctx context.Context, db *sql.DB) ([]inbox.MigrationState, error) {
	return migrate.StatusSQLite(ctx, db, "ledger", sqliteMigrations())
}

// SeedAccountsSQLite makes sure accounts 1..n exist in a SQLite database
// (new ones with balance 0).
func SeedAccountsSQLite(ctx context.Context, db *sql.DB, n int) error {
	_, err := db.ExecContext(ctx, `WITH RECURSIVE s(i) AS (SELECT 1 WHERE ?1 >= 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?1)
INSERT INTO accounts (id) SELECT i FROM s WHERE true ON CONFLICT DO NOTHING`, n)
	if err != nil {
		return fmt.Errorf("effects: seed accounts: %w", err)
	}
	return nil
}

// OpenAccountsSQLite opens the accounts with the given IDs in a SQLite
// database (balance 0) and returns how many were new, as [OpenAccounts]
// does on PostgreSQL.
func OpenAccountsSQLite(ctx context.Context, db *sql.DB, ids []int64) (int, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("effects: open accounts: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit a no-op
	n := 0
	for _, id := range ids {
		r, err := tx.ExecContext(ctx, `INSERT INTO accounts (id) VALUES (?) ON CONFLICT DO NOTHING`, id)
		if err != nil {
			return 0, fmt.Errorf("effects: open accounts: %w", err)
		}
		k, _ := r.RowsAffected()
		n += int(k)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("effects: open accounts: %w", err)
	}
	return n, nil
}

// SQLiteLedger is the [Ledger] effect on SQLite: each intent adds its
// amount to an account's balance and appends a ledger entry carrying the
// message ID and the inbox scope. It implements inbox.Handler[*sql.Tx].
// Bad input and unknown accounts are permanent errors, as on PostgreSQL.
// The batch's transaction holds the file's write lock, so balances need
// no row locks and no ordering.
type SQLiteLedger struct{ l Ledger }

// NewSQLiteLedger returns the ledger effect for SQLite. Its entries carry
// the scope of the processor it runs under; called outside one,
// [DefaultScope].
func NewSQLiteLedger() *SQLiteLedger { return &SQLiteLedger{} }

// NewScopedSQLiteLedger returns a SQLite ledger effect bound to one inbox
// scope: run under a processor with another scope, every batch fails.
func NewScopedSQLiteLedger(scope string) (*SQLiteLedger, error) {
	l, err := NewScopedLedger(scope)
	if err != nil {
		return nil, err
	}
	return &SQLiteLedger{l: *l}, nil
}

// Scope returns the inbox scope the ledger is bound to, or "".
func (s *SQLiteLedger) Scope() string { return s.l.scope }

// WithFollowUps returns a copy of s that emits, for every credit it
// applies, the follow-up [Ledger.WithFollowUps] describes, added to the
// SQLite outbox (package sqliteoutbox) in the batch's transaction: it
// commits or rolls back with the credit. The file needs the outbox schema
// (sqliteoutbox.Store.Migrate).
func (s *SQLiteLedger) WithFollowUps(f FollowUps) (*SQLiteLedger, error) {
	l, err := s.l.WithFollowUps(f)
	if err != nil {
		return nil, err
	}
	return &SQLiteLedger{l: *l}, nil
}

// FollowUpsOf returns the ledger's follow-up configuration, if it emits
// follow-ups.
func (s *SQLiteLedger) FollowUpsOf() (FollowUps, bool) { return s.l.FollowUpsOf() }

// Handle implements inbox.Handler[*sql.Tx].
func (s *SQLiteLedger) Handle(ctx context.Context, tx *sql.Tx, msgs []inbox.Message, errs []error) error {
	scope, err := s.l.scopeFor(ctx)
	if err != nil {
		return err
	}
	intents := make([]Intent, len(msgs))
	totals := make(map[int64]int64, min(len(msgs), 1024))
	for i := range msgs {
		in, err := ParseIntent(msgs[i].Payload)
		if err != nil {
			errs[i] = inbox.BadInput(err)
			continue
		}
		intents[i] = in
		totals[in.Account] += in.Amount // at most 1e9 × batch size: no overflow
	}
	if len(totals) == 0 {
		return nil
	}
	distinct := make([]int64, 0, len(totals))
	for a := range totals {
		distinct = append(distinct, a)
	}
	slices.Sort(distinct)
	// The balances, 256 accounts a statement; RETURNING names the
	// accounts that exist.
	known := make(map[int64]bool, len(distinct))
	args := make([]any, 0, 4*sqliteChunk)
	for rest := distinct; len(rest) > 0; {
		n := min(len(rest), sqliteChunk)
		args = args[:0]
		for _, a := range rest[:n] {
			args = append(args, a, totals[a])
		}
		rows, err := tx.QueryContext(ctx, `UPDATE accounts SET balance = balance + v.column2 FROM (VALUES `+sqliteValues(n, 2)+
			`) AS v WHERE accounts.id = v.column1 RETURNING accounts.id`, args...)
		if err != nil {
			return fmt.Errorf("effects: ledger: %w", err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return fmt.Errorf("effects: ledger: %w", err)
			}
			known[id] = true
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return fmt.Errorf("effects: ledger: %w", err)
		}
		rest = rest[n:]
	}
	// The entries of the intents for known accounts, 256 a statement.
	args = args[:0]
	flush := func() error {
		if len(args) == 0 {
			return nil
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO ledger_entries (scope, message_id, account, amount) VALUES `+sqliteValues(len(args)/4, 4), args...)
		args = args[:0]
		if err != nil {
			return fmt.Errorf("effects: ledger: %w", err)
		}
		return nil
	}
	for i := range msgs {
		if errs[i] != nil {
			continue
		}
		in := intents[i]
		if !known[in.Account] {
			errs[i] = inbox.BadInput(fmt.Errorf("%w: unknown account %d", ErrBadIntent, in.Account))
			continue
		}
		args = append(args, scope, msgs[i].ID, in.Account, in.Amount)
		if len(args) == 4*sqliteChunk {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if s.l.follow == nil {
		return nil
	}
	return s.emit(ctx, tx, msgs, intents, errs)
}

// emit adds the follow-up of every message applied in this batch to the
// outbox, in the batch's transaction. An ID the outbox holds with other
// contents fails the batch with a permanent error; the processor then
// applies its messages one at a time and rejects that one.
func (s *SQLiteLedger) emit(ctx context.Context, tx *sql.Tx, msgs []inbox.Message, intents []Intent, errs []error) error {
	f := s.l.follow
	out := make([]inbox.Intent, 0, len(msgs))
	for i := range msgs {
		if errs[i] != nil {
			continue
		}
		id, err := outbox.FollowUpID(msgs[i].ID, f.Kind)
		if err != nil {
			return inbox.Permanent(fmt.Errorf("effects: follow-up of %s: %w", msgs[i].ID, err))
		}
		in := intents[i]
		out = append(out, inbox.Intent{ID: id, Subject: f.Subject + "." + strconv.FormatInt(in.Account%16, 10),
			Payload: in.AppendJSON(make([]byte, 0, 48)), Parent: msgs[i].ID})
	}
	if err := sqliteoutbox.Add(ctx, tx, out...); err != nil {
		if errors.Is(err, inbox.ErrConflict) || errors.Is(err, inbox.ErrBadIntent) {
			return inbox.Permanent(fmt.Errorf("effects: follow-ups: %w", err))
		}
		return fmt.Errorf("effects: follow-ups: %w", err)
	}
	return nil
}

// sqliteChunk is how many rows one ledger statement carries.
const sqliteChunk = 256

// sqliteValues returns "(?, ?, …), …": rows groups of cols placeholders.
func sqliteValues(rows, cols int) string {
	one := "(" + strings.Repeat("?, ", cols-1) + "?)"
	return strings.Repeat(one+", ", rows-1) + one
}
