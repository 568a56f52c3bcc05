package effects

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"slices"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
)

//go:embed sqlite_migrations/*.sql
var sqliteMigrationFS embed.FS

func sqliteMigrations() []migrate.Migration {
	ms, err := migrate.Load(sqliteMigrationFS, "sqlite_migrations")
	if err != nil {
		panic(err)
	}
	return ms
}

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
// message ID and the inbox scope. It implements inbox.HandlerOf[*sql.Tx].
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

// Handle implements inbox.HandlerOf[*sql.Tx].
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
	upd, err := tx.PrepareContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ?`)
	if err != nil {
		return fmt.Errorf("effects: ledger: %w", err)
	}
	defer upd.Close()
	var unknown []int64
	for _, a := range distinct {
		r, err := upd.ExecContext(ctx, totals[a], a)
		if err != nil {
			return fmt.Errorf("effects: ledger: %w", err)
		}
		if n, err := r.RowsAffected(); err != nil {
			return fmt.Errorf("effects: ledger: %w", err)
		} else if n == 0 {
			unknown = append(unknown, a)
		}
	}
	ins, err := tx.PrepareContext(ctx, `INSERT INTO ledger_entries (scope, message_id, account, amount) VALUES (?, ?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("effects: ledger: %w", err)
	}
	defer ins.Close()
	for i := range msgs {
		if errs[i] != nil {
			continue
		}
		in := intents[i]
		if slices.Contains(unknown, in.Account) {
			errs[i] = inbox.BadInput(fmt.Errorf("%w: unknown account %d", ErrBadIntent, in.Account))
			continue
		}
		if _, err := ins.ExecContext(ctx, scope, msgs[i].ID, in.Account, in.Amount); err != nil {
			return fmt.Errorf("effects: ledger: %w", err)
		}
	}
	return nil
}
