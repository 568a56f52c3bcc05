package sqliteinbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/migrate"
)

// Migrate creates or upgrades the inbox tables in the store's database,
// recording applied versions in jetinbox_migrations, and returns how many
// migrations it applied. It is safe to call concurrently and repeatedly.
func (s *Store) Migrate(ctx context.Context) (int, error) {
	return migrate.ApplySQLite(ctx, s.db, "inbox", migrations())
}

// MigrationStatus compares the inbox migrations this package ships with
// what the database recorded.
func (s *Store) MigrationStatus(ctx context.Context) ([]inbox.MigrationState, error) {
	return migrate.StatusSQLite(ctx, s.db, "inbox", migrations())
}

// MigrationSQL returns the SQLite inbox schema as one SQL script.
func (s *Store) MigrationSQL() string { return migrate.Script("inbox", migrations()) }

// CheckSchema reports [inbox.ErrNotMigrated] unless every inbox migration
// this package ships has been applied.
func (s *Store) CheckSchema(ctx context.Context) error {
	ms := migrations()
	want := ms[len(ms)-1].Version
	have, ok, err := migrate.VersionSQLite(ctx, s.db, "inbox")
	switch {
	case err != nil:
		return fmt.Errorf("inbox: check schema: %w", err)
	case !ok:
		return inbox.ErrNotMigrated
	case have < want:
		return fmt.Errorf("%w: at version %d, this library needs %d", inbox.ErrNotMigrated, have, want)
	}
	return nil
}

// Prune deletes inbox rows received longer than opts.OlderThan ago, in
// batches of opts.BatchSize, and returns how many it deleted; see
// [inbox.PruneOptions] for the options and the horizon it refuses. The cut-off
// comes from this machine's clock, the one received_at was written with.
func (s *Store) Prune(ctx context.Context, opts inbox.PruneOptions) (int64, error) {
	opts, err := opts.Checked()
	if err != nil {
		return 0, err
	}
	cutoff := time.Now().Add(-opts.OlderThan).UnixMicro()
	var total int64
	for {
		r, err := s.db.ExecContext(ctx, `DELETE FROM inbox WHERE (scope, message_id) IN (
	SELECT scope, message_id FROM inbox WHERE received_at < ? AND (? = '' OR scope = ?) LIMIT ?)`,
			cutoff, opts.Scope, opts.Scope, opts.BatchSize)
		if err != nil {
			return total, fmt.Errorf("inbox: prune: %w", err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("inbox: prune: %w", err)
		}
		total += n
		if n < int64(opts.BatchSize) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// Check implements [driver.Store]: the file answers, the inbox migrations
// this package ships are applied ([inbox.ErrNotMigrated] otherwise), and
// the connection may write (PRAGMA query_only off; otherwise it wraps
// [inbox.ErrDatabaseUnfit]).
func (s *Store) Check(ctx context.Context) error {
	if err := s.CheckSchema(ctx); err != nil {
		return err
	}
	var queryOnly int
	if err := s.db.QueryRowContext(ctx, "PRAGMA query_only").Scan(&queryOnly); err != nil {
		return fmt.Errorf("inbox: check: %w", err)
	}
	if queryOnly != 0 {
		return fmt.Errorf("%w: the connection is query-only (PRAGMA query_only)", inbox.ErrDatabaseUnfit)
	}
	return nil
}
