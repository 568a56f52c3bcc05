package inbox

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

func migrations() []migrate.Migration {
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		panic(err) // embedded at build time; a bad name is a build bug
	}
	return ms
}

// Migrate creates or upgrades the inbox tables (inbox, inbox_conflicts) in
// the database db points at, recording applied versions in
// jetinbox_migrations. It is safe to call concurrently and repeatedly. It
// returns how many migrations it applied. Nothing in this package migrates
// implicitly: call Migrate from a deploy step (the CLI's `jetinbox migrate`)
// or run [MigrationSQL] with your own tool.
func Migrate(ctx context.Context, db Beginner) (int, error) {
	return migrate.Apply(ctx, db, "inbox", migrations())
}

// MigrationState is one migration as the database and this library see it:
// applied, pending, edited after it was applied, or unknown to this
// library (a newer release applied it).
type MigrationState = migrate.State

// MigrationStatus compares the inbox migrations this library ships with
// what the database recorded.
func MigrationStatus(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]MigrationState, error) {
	return migrate.Status(ctx, db, "inbox", migrations())
}

// MigrationSQL returns the inbox schema as one SQL script, for people who run
// their own migration tool.
func MigrationSQL() string { return migrate.Script("inbox", migrations()) }

// ErrNotMigrated is returned by [CheckSchema] when the inbox tables are
// missing or older than this library.
var ErrNotMigrated = errors.New("inbox: schema not migrated (run `jetinbox migrate` or apply MigrationSQL)")

// Querier runs a query returning one row. *pgxpool.Pool, *pgx.Conn and
// pgx.Tx satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckSchema reports [ErrNotMigrated] unless every inbox migration this
// library ships has been applied. Workers call it at start instead of
// migrating on their own.
func CheckSchema(ctx context.Context, db Querier) error {
	ms := migrations()
	want := ms[len(ms)-1].Version
	var have int
	err := db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM jetinbox_migrations WHERE component = 'inbox'`).Scan(&have)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return ErrNotMigrated
	}
	if err != nil {
		return fmt.Errorf("inbox: check schema: %w", err)
	}
	if have < want {
		return fmt.Errorf("%w: at version %d, this library needs %d", ErrNotMigrated, have, want)
	}
	return nil
}
