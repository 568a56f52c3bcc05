package inbox

import "errors"

// MigrationState is one migration as the database and this library see it.
// Both stores' MigrationStatus return one per migration, in version order.
type MigrationState struct {
	// Component names the schema the migration belongs to: "inbox",
	// "outbox" or "ledger".
	Component string
	// Version and Name are the migration's number and file name.
	Version int
	Name    string
	// Applied: the database records it. Pending: a migration of this
	// library the database has not applied. Edited: applied with other SQL
	// than this library's. Unknown: the database records a version this
	// library does not have (a newer release applied it).
	Applied, Pending, Edited, Unknown bool
}

// ErrNotMigrated is returned by a store's CheckSchema when the inbox tables
// are missing or older than this library.
var ErrNotMigrated = errors.New("inbox: schema not migrated (call the store's Migrate, as pginbox.New(pool).Migrate(ctx), or run `jetinbox migrate`, or apply its MigrationSQL)")
