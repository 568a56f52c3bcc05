package outbox

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Component is the name the outbox's migrations are recorded under in
// jetinbox_migrations.
const Component = "outbox"

func migrations() []migrate.Migration {
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		panic(err) // embedded at build time; a bad name is a build bug
	}
	return ms
}

// Migrate creates or upgrades the outbox table in the database db points at,
// recording applied versions in jetinbox_migrations under the component
// "outbox". It is safe to call concurrently and repeatedly, and returns how
// many migrations it applied. `jetinbox migrate` calls it.
func Migrate(ctx context.Context, db pgmigrate.Beginner) (int, error) {
	return pgmigrate.Apply(ctx, db, Component, migrations())
}

// MigrationSQL returns the outbox schema as one SQL script, for people who
// run their own migration tool.
func MigrationSQL() string { return migrate.Script(Component, migrations()) }

// MigrationStatus compares the outbox migrations this package ships with
// what the database recorded.
func MigrationStatus(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]inbox.MigrationState, error) {
	return pgmigrate.Status(ctx, db, Component, migrations())
}

// ErrNotMigrated is returned by [CheckSchema] when the outbox table is
// missing or older than this package.
var ErrNotMigrated = errors.New("outbox: schema not migrated (run `jetinbox migrate` or apply MigrationSQL)")

// CheckSchema reports [ErrNotMigrated] unless every outbox migration this
// package ships has been applied. The relay calls it at start.
func CheckSchema(ctx context.Context, db Querier) error {
	ms := migrations()
	want := ms[len(ms)-1].Version
	var have int
	err := queryRow(ctx, db, `SELECT coalesce(max(version), 0) FROM jetinbox_migrations WHERE component = $1`, []any{Component}, &have)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return ErrNotMigrated
	}
	if err != nil {
		return fmt.Errorf("outbox: check schema: %w", err)
	}
	if have < want {
		return fmt.Errorf("%w: at version %d, this package needs %d", ErrNotMigrated, have, want)
	}
	return nil
}

// PruneDB runs statements and queries. *pgxpool.Pool, *pgx.Conn and
// pgx.Tx satisfy it.
type PruneDB interface {
	Querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// queryRow runs a query that returns one row through a [Querier] and
// scans it into dest.
func queryRow(ctx context.Context, db Querier, sql string, args []any, dest ...any) error {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}
