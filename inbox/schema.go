package inbox

import (
	"context"
	"embed"

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

// MigrationSQL returns the inbox schema as one SQL script, for people who run
// their own migration tool.
func MigrationSQL() string { return migrate.Script("inbox", migrations()) }
