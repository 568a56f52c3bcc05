// Package migrate applies versioned SQL files embedded in a package, one
// transaction per file, under an advisory lock so concurrent starters agree.
//
// Each applied file is recorded with a SHA-256 checksum of its SQL: a file
// edited after it was applied is an error (ship a new migration instead),
// not skipped without a word. A file cannot be half applied: PostgreSQL runs
// its DDL in the file's transaction, so there is no dirty state to repair;
// a failed file leaves nothing behind and is reported.
package migrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Beginner starts a transaction; *pgx.Conn, *pgxpool.Pool and pgx.Tx satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migration is one versioned SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Checksum is the hex SHA-256 of the migration's SQL.
func (m Migration) Checksum() string {
	sum := sha256.Sum256([]byte(m.SQL))
	return hex.EncodeToString(sum[:])
}

// ErrEdited is returned when a migration recorded as applied no longer has
// the SQL it was applied with.
var ErrEdited = errors.New("migrate: an applied migration was edited")

// Load reads files named NNNN_name.sql from dir in fsys, in version order.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migrate: file %s is not named NNNN_name.sql", name)
		}
		b, err := fs.ReadFile(fsys, dir+"/"+name)
		if err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// Script returns all migrations as one SQL script, for people who run their
// own migration tool.
func Script(component string, ms []Migration) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "-- %s migration %d: %s\n%s\n", component, m.Version, m.Name, strings.TrimSpace(m.SQL))
	}
	return b.String()
}

const bootstrap = `CREATE TABLE IF NOT EXISTS jetinbox_migrations (
	component  text        NOT NULL,
	version    integer     NOT NULL,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (component, version)
);
-- Added with checksums; rows applied before have none until the next Apply
-- records the SQL they were applied with.
ALTER TABLE jetinbox_migrations ADD COLUMN IF NOT EXISTS checksum text`

// Apply applies the migrations of component that are not yet recorded and
// returns how many it applied.
func Apply(ctx context.Context, db Beginner, component string, ms []Migration) (int, error) {
	applied := 0
	for _, m := range ms {
		did, err := applyOne(ctx, db, component, m)
		if err != nil {
			return applied, err
		}
		if did {
			applied++
		}
	}
	return applied, nil
}

func applyOne(ctx context.Context, db Beginner, component string, m Migration) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	// One lock for every component: the bootstrap table is shared.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(7305924671)`); err != nil {
		return false, fmt.Errorf("migrate %s: lock: %w", component, err)
	}
	if _, err := tx.Exec(ctx, bootstrap); err != nil {
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	var stored *string
	err = tx.QueryRow(ctx, `SELECT checksum FROM jetinbox_migrations WHERE component = $1 AND version = $2`,
		component, m.Version).Scan(&stored)
	switch {
	case err == nil && stored != nil && *stored != m.Checksum():
		return false, fmt.Errorf("%w: %s %s was applied with other SQL (checksum %.12s…, the file's is %.12s…): ship a new migration instead",
			ErrEdited, component, m.Name, *stored, m.Checksum())
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
		return false, fmt.Errorf("migrate %s %s: %w", component, m.Name, err)
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

func commit(ctx context.Context, tx pgx.Tx, component string) error {
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate %s: commit: %w", component, err)
	}
	return nil
}

// State is one migration as the database and the files see it.
type State struct {
	Component string
	Version   int
	Name      string
	// Applied: the database records it. Pending: a file the database has
	// not applied. Edited: applied with other SQL than the file's now.
	// Unknown: the database records a version no file has (a newer
	// release applied it).
	Applied, Pending, Edited, Unknown bool
}

// Status compares the files of component with what the database recorded.
// A database that was never migrated has every file pending.
func Status(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, component string, ms []Migration) ([]State, error) {
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
	var out []State
	for _, m := range ms {
		st := State{Component: component, Version: m.Version, Name: m.Name}
		sum, ok := recorded[m.Version]
		st.Applied, st.Pending = ok, !ok
		st.Edited = ok && sum != nil && *sum != m.Checksum()
		delete(recorded, m.Version)
		out = append(out, st)
	}
	for v := range recorded {
		out = append(out, State{Component: component, Version: v, Name: names[v], Applied: true, Unknown: true})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}
