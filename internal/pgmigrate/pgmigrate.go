// Package pgmigrate applies versioned SQL files to PostgreSQL, one
// transaction per file, under a lock on the bookkeeping table so
// concurrent starters agree; the files and their bookkeeping are package
// migrate's, shared with SQLite.
//
// The lock is SHARE ROW EXCLUSIVE on jetinbox_migrations: it conflicts with
// itself and with writes, not with reads, so only a role that may write the
// table (the migrator, a superuser) can make Apply wait for it; a role that
// may only read it (a consumer checking the schema, a verifier) cannot. An
// advisory lock, by contrast, can be taken by any login role. Every other
// lock a migration takes is waited for at most lock_timeout (the session's,
// or [DefaultLockTimeout] when it has none): a session that holds a table
// the migration alters ends the wait with an error naming it, wrapping
// [ErrLockTimeout], rather than a hang that also queues every later
// statement on that table behind the migration.
//
// Each applied file is recorded with a SHA-256 checksum of its SQL: a file
// edited after it was applied is an error (ship a new migration instead),
// not skipped without a word. A file cannot be half applied: PostgreSQL runs
// its DDL in the file's transaction, so there is no dirty state to repair;
// a failed file leaves nothing behind and is reported.
package pgmigrate

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/internal/migrate"
)

// Beginner starts a transaction; *pgx.Conn, *pgxpool.Pool and pgx.Tx satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// migrate.Migration is one versioned SQL file.
// bootstrap creates the bookkeeping table; it runs in a transaction of its
// own, before the lock on the table can be taken.
const bootstrap = `CREATE TABLE IF NOT EXISTS jetinbox_migrations (
	component  text        NOT NULL,
	version    integer     NOT NULL,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (component, version)
)`

// addChecksum adds the checksum column to a table made before checksums were
// kept; rows applied before have none until the next Apply records the SQL
// they were applied with. ALTER TABLE takes ACCESS EXCLUSIVE, which every
// reader of the table conflicts with: it runs only when the column is
// missing, so that readers never delay a migration.
const addChecksum = `ALTER TABLE jetinbox_migrations ADD COLUMN IF NOT EXISTS checksum text`

// lockSQL takes the migrators' lock (see the package documentation). It
// waits without a time limit whatever lock_timeout says: only another
// migrator can hold it, and starters that migrate at once take turns.
const lockSQL = `SET LOCAL lock_timeout = 0;
LOCK TABLE jetinbox_migrations IN SHARE ROW EXCLUSIVE MODE`

// DefaultLockTimeout is how long a migration waits for a lock that another
// session holds when the migrator's session sets no lock_timeout of its own
// (set one in the role's settings or the connection's options to wait
// longer or shorter). While a migration waits for a table's ACCESS
// EXCLUSIVE lock, every later statement on that table waits behind it.
const DefaultLockTimeout = 10 * time.Second

// ErrLockTimeout is wrapped by the error Apply returns when a migration
// waited longer than lock_timeout for a lock another session holds. The
// message names the sessions holding table locks at that moment, the one
// waited for among them.
var ErrLockTimeout = errors.New("migrate: another session holds a lock the migration needs")

// prepareSQL sets lock_timeout for the rest of the transaction, the
// session's own (from the role's settings, the connection's options or the
// server's configuration) or $1 milliseconds when that is none, and returns
// the value in force as PostgreSQL writes it; and whether
// jetinbox_migrations has its checksum column.
const prepareSQL = `SELECT set_config('lock_timeout', CASE WHEN reset_val = '0' THEN $1 ELSE reset_val END, true),
	EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'jetinbox_migrations'::regclass AND attname = 'checksum' AND NOT attisdropped)
FROM pg_settings WHERE name = 'lock_timeout'`

// Apply applies the migrations of component that are not yet recorded and
// returns how many it applied.
func Apply(ctx context.Context, db Beginner, component string, ms []migrate.Migration) (int, error) {
	applied := 0
	for _, m := range ms {
		did, err := applyOne(ctx, db, component, m)
		if errors.Is(err, errNoTable) {
			if err = createTable(ctx, db, component); err == nil {
				did, err = applyOne(ctx, db, component, m)
			}
		}
		if err != nil {
			return applied, err
		}
		if did {
			applied++
		}
	}
	return applied, nil
}

// errNoTable says jetinbox_migrations does not exist yet.
var errNoTable = errors.New("migrate: no jetinbox_migrations table")

// createTable creates jetinbox_migrations. Two starters may both find it
// missing and both create it: the second one's CREATE waits for the first
// one's commit and then fails on a unique index of the catalog (reported
// as a duplicate key, relation or type, depending on which it meets
// first), which means the table is there.
func createTable(ctx context.Context, db Beginner, component string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", component, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	if _, err := tx.Exec(ctx, bootstrap); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07" || pgErr.Code == "42710") { // unique_violation, duplicate_table, duplicate_object (its row type)
			return nil
		}
		return fmt.Errorf("migrate %s: create jetinbox_migrations: %w", component, err)
	}
	return commit(ctx, tx, component)
}

func applyOne(ctx context.Context, db Beginner, component string, m migrate.Migration) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	// One lock for every component: the bookkeeping table is shared.
	if _, err := tx.Exec(ctx, lockSQL); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
			return false, errNoTable
		}
		return false, fmt.Errorf("migrate %s: lock jetinbox_migrations: %w", component, err)
	}
	var timeout string
	var hasChecksum bool
	if err := tx.QueryRow(ctx, prepareSQL, strconv.FormatInt(DefaultLockTimeout.Milliseconds(), 10)).Scan(&timeout, &hasChecksum); err != nil {
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	if !hasChecksum {
		if _, err := tx.Exec(ctx, addChecksum); err != nil {
			return false, lockError(ctx, db, tx, component, "jetinbox_migrations", timeout, err)
		}
	}
	var stored *string
	err = tx.QueryRow(ctx, `SELECT checksum FROM jetinbox_migrations WHERE component = $1 AND version = $2`,
		component, m.Version).Scan(&stored)
	switch {
	case err == nil && stored != nil && *stored != m.Checksum():
		return false, fmt.Errorf("%w: %s %s was applied with other SQL (checksum %.12s…, the file's is %.12s…): ship a new migration instead",
			migrate.ErrEdited, component, m.Name, *stored, m.Checksum())
	case err == nil && stored == nil:
		// Applied before checksums were kept: record this SQL as the one.
		if _, err := tx.Exec(ctx, `UPDATE jetinbox_migrations SET checksum = $3 WHERE component = $1 AND version = $2`,
			component, m.Version, m.Checksum()); err != nil {
			return false, fmt.Errorf("migrate %s: %w", component, err)
		}
		return false, commit(ctx, tx, component)
	case err == nil:
		return false, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return false, lockError(ctx, db, tx, component, m.Name, timeout, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO jetinbox_migrations (component, version, name, checksum) VALUES ($1, $2, $3, $4)`,
		component, m.Version, m.Name, m.Checksum()); err != nil {
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	if err := commit(ctx, tx, component); err != nil {
		return false, err
	}
	return true, nil
}

// blockersSQL lists the sessions holding locks on tables of this database
// (on jetinbox_migrations if $1, on the others if not) once a migration's
// wait for one ran out: among them the ones it waited for, which
// pg_blocking_pids can no longer tell once the wait is over. pg_locks and
// the role of a session are visible to every role; how long its
// transaction has been open only to superusers and members of
// pg_read_all_stats, and those that show it come first.
const blockersSQL = `SELECT l.pid, coalesce(a.usename, ''), coalesce(extract(epoch FROM now() - a.xact_start), -1)::float8,
	string_agg(DISTINCT c.relname || ' ' || l.mode, ', ')
FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation AND c.relkind IN ('r', 'p', 'm')
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND c.relnamespace <> 'pg_catalog'::regnamespace
  AND (c.oid = 'jetinbox_migrations'::regclass) = $1
GROUP BY 1, 2, 3
ORDER BY 3 DESC, 1
LIMIT 5`

// lockError turns a lock_timeout cancellation (55P03) of what into an error
// wrapping ErrLockTimeout that names the sessions holding table locks; any
// other error is wrapped as it is. It rolls tx back first: db may be the
// connection tx runs on.
func lockError(ctx context.Context, db Beginner, tx pgx.Tx, component, what, timeout string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available
		return fmt.Errorf("migrate %s %s: %w", component, what, err)
	}
	_ = tx.Rollback(ctx)
	held := "no other session holds a table lock now"
	if list, qerr := blockers(ctx, db, what == "jetinbox_migrations"); qerr != nil {
		held = "listing the sessions that hold locks failed: " + qerr.Error()
	} else if list != "" {
		held = "sessions holding table locks now: " + list
	}
	return fmt.Errorf("%w: %s %s waited longer than lock_timeout %s (%s); end the transaction that holds it, or set a longer lock_timeout for the migrator: %w",
		ErrLockTimeout, component, what, timeout, held, err)
}

func blockers(ctx context.Context, db Beginner, onMigrations bool) (string, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	rows, err := tx.Query(ctx, blockersSQL, onMigrations)
	if err != nil {
		return "", err
	}
	var out []string
	for rows.Next() {
		var pid int
		var role, locks string
		var age float64
		if err := rows.Scan(&pid, &role, &age, &locks); err != nil {
			rows.Close()
			return "", err
		}
		open := ""
		if age >= 0 {
			open = fmt.Sprintf(", transaction open %s", time.Duration(age*float64(time.Second)).Round(time.Second))
		}
		out = append(out, fmt.Sprintf("pid %d (role %s%s: %s)", pid, role, open, locks))
	}
	return strings.Join(out, "; "), rows.Err()
}

func commit(ctx context.Context, tx pgx.Tx, component string) error {
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate %s: commit: %w", component, err)
	}
	return nil
}

// A database that was never migrated has every file pending.
func Status(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, component string, ms []migrate.Migration) ([]migrate.State, error) {
	recorded := map[int]*string{}
	names := map[int]string{}
	rows, err := db.Query(ctx, `SELECT version, name, checksum FROM jetinbox_migrations WHERE component = $1`, component)
	if err == nil {
		for rows.Next() {
			var v int
			var name string
			var sum *string
			if err := rows.Scan(&v, &name, &sum); err != nil {
				rows.Close()
				return nil, fmt.Errorf("migrate %s: status: %w", component, err)
			}
			recorded[v], names[v] = sum, name
		}
		err = rows.Err()
	}
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P01") { // undefined_table: never migrated
		return nil, fmt.Errorf("migrate %s: status: %w", component, err)
	}
	var out []migrate.State
	for _, m := range ms {
		st := migrate.State{Component: component, Version: m.Version, Name: m.Name}
		sum, ok := recorded[m.Version]
		st.Applied, st.Pending = ok, !ok
		st.Edited = ok && sum != nil && *sum != m.Checksum()
		delete(recorded, m.Version)
		out = append(out, st)
	}
	for v := range recorded {
		out = append(out, migrate.State{Component: component, Version: v, Name: names[v], Applied: true, Unknown: true})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Check reports notMigrated (wrapped, with the versions, when the database
// is behind) unless every migration in ms has been recorded for component:
// the CheckSchema of each store package.
func Check(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, component string, ms []migrate.Migration, notMigrated error) error {
	want := ms[len(ms)-1].Version
	var have int
	rows, err := db.Query(ctx, `SELECT coalesce(max(version), 0) FROM jetinbox_migrations WHERE component = $1`, component)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&have}, func() error { return nil })
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: never migrated
		return notMigrated
	}
	if err != nil {
		return fmt.Errorf("%s: check schema: %w", component, err)
	}
	if have < want {
		return fmt.Errorf("%w: at version %d, this package needs %d", notMigrated, have, want)
	}
	return nil
}
