package inbox

import (
	"errors"

	"github.com/jetinbox/jetinbox/internal/migrate"
)

// MigrationState is one migration as the database and this library see it:
// applied, pending, edited after it was applied, or unknown to this
// library (a newer release applied it). Both stores' MigrationStatus
// return it.
type MigrationState = migrate.State

// ErrNotMigrated is returned by a store's CheckSchema when the inbox tables
// are missing or older than this library.
var ErrNotMigrated = errors.New("inbox: schema not migrated (run `jetinbox migrate` or apply MigrationSQL)")
