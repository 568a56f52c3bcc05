package effects

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

func migrations() []migrate.Migration {
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		panic(err)
	}
	return ms
}

// Migrate creates or upgrades the ledger tables (accounts, ledger_entries).
func Migrate(ctx context.Context, db inbox.Beginner) (int, error) {
	return migrate.Apply(ctx, db, "ledger", migrations())
}

// MigrationSQL returns the ledger schema as one SQL script.
func MigrationSQL() string { return migrate.Script("ledger", migrations()) }

// SeedAccounts makes sure accounts 1..n exist (new ones with balance 0).
func SeedAccounts(ctx context.Context, db inbox.Execer, n int) error {
	_, err := db.Exec(ctx, `INSERT INTO accounts (id) SELECT generate_series(1, $1::bigint) ON CONFLICT DO NOTHING`, n)
	if err != nil {
		return fmt.Errorf("effects: seed accounts: %w", err)
	}
	return nil
}

// Ledger is the demo effect: each intent adds its amount to an account's
// balance and appends a ledger entry carrying the message ID. It implements
// [inbox.Handler] with one statement per batch. Bad input (see
// [ParseIntent]) and unknown accounts are permanent errors.
type Ledger struct{}

// NewLedger returns the ledger effect.
func NewLedger() *Ledger { return &Ledger{} }

const lockSQL = `SELECT id FROM accounts WHERE id = ANY($1::bigint[]) ORDER BY id FOR NO KEY UPDATE`

// applySQL applies every valid intent of a batch at once. Intents for unknown
// accounts are left out of both writes and returned, so the transaction stays
// healthy and each can be rejected alone.
const applySQL = `WITH t AS (
	SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS t(message_id, account, amount)
), known AS (
	SELECT t.* FROM t JOIN accounts a ON a.id = t.account
), upd AS (
	UPDATE accounts a SET balance = a.balance + s.total
	FROM (SELECT account, sum(amount)::bigint AS total FROM known GROUP BY account) s
	WHERE a.id = s.account
), ins AS (
	INSERT INTO ledger_entries (message_id, account, amount) SELECT message_id, account, amount FROM known
)
SELECT t.message_id FROM t WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.id = t.account)`

// Handle implements [inbox.Handler].
func (l *Ledger) Handle(ctx context.Context, tx pgx.Tx, msgs []inbox.Message, errs []error) error {
	ids := make([]string, 0, len(msgs))
	accounts := make([]int64, 0, len(msgs))
	amounts := make([]int64, 0, len(msgs))
	for i := range msgs {
		in, err := ParseIntent(msgs[i].Payload)
		if err != nil {
			errs[i] = inbox.Permanent(err)
			continue
		}
		ids = append(ids, msgs[i].ID)
		accounts = append(accounts, in.Account)
		amounts = append(amounts, in.Amount)
	}
	if len(ids) == 0 {
		return nil
	}
	// Lock the touched accounts in ID order first, so that concurrent
	// batches over overlapping accounts queue up instead of deadlocking
	// (PostgreSQL would find a deadlock only after deadlock_timeout, 1s).
	// Both statements go out in one round trip.
	var b pgx.Batch
	b.Queue(lockSQL, accounts)
	b.Queue(applySQL, ids, accounts, amounts)
	br := tx.SendBatch(ctx, &b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("effects: ledger: lock accounts: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("effects: ledger: %w", err)
	}
	var unknown map[string]bool
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("effects: ledger: %w", err)
		}
		if unknown == nil {
			unknown = map[string]bool{}
		}
		unknown[id] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("effects: ledger: %w", err)
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("effects: ledger: %w", err)
	}
	for i := range msgs {
		if errs[i] == nil && unknown[msgs[i].ID] {
			in, _ := ParseIntent(msgs[i].Payload)
			errs[i] = inbox.Permanent(fmt.Errorf("%w: unknown account %d", ErrBadIntent, in.Account))
		}
	}
	return nil
}
