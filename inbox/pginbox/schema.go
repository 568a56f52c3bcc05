package pginbox

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
	"github.com/jetinbox/jetinbox/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations are the embedded migrations, read once.
var migrations = migrate.Embedded(migrationFS, "migrations")

// Migrate creates or upgrades the inbox tables (inbox, inbox_conflicts),
// recording applied versions in jetinbox_migrations. It is safe to call
// concurrently and repeatedly. It returns how many migrations it applied.
// Nothing migrates implicitly: call Migrate from a deploy step (the CLI's
// `jetinbox migrate`) or run [Store.MigrationSQL] with your own tool.
func (s *Store) Migrate(ctx context.Context) (int, error) {
	return pgmigrate.Apply(ctx, s.db, "inbox", migrations())
}

// MigrationStatus compares the inbox migrations this library ships with
// what the database recorded.
func (s *Store) MigrationStatus(ctx context.Context) ([]inbox.MigrationState, error) {
	return pgmigrate.Status(ctx, s.db, "inbox", migrations())
}

// MigrationSQL returns the inbox schema as one SQL script, for people who
// run their own migration tool.
func (s *Store) MigrationSQL() string { return migrate.Script("inbox", migrations()) }

// CheckSchema reports [inbox.ErrNotMigrated] unless every inbox migration
// this library ships has been applied. Workers call it at start instead of
// migrating on their own.
func (s *Store) CheckSchema(ctx context.Context) error {
	ms := migrations()
	want := ms[len(ms)-1].Version
	var have int
	err := s.db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM jetinbox_migrations WHERE component = 'inbox'`).Scan(&have)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return inbox.ErrNotMigrated
	}
	if err != nil {
		return fmt.Errorf("inbox: check schema: %w", err)
	}
	if have < want {
		return fmt.Errorf("%w: at version %d, this library needs %d", inbox.ErrNotMigrated, have, want)
	}
	return nil
}
