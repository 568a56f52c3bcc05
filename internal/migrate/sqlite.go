package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// sqliteBootstrap is the migrations table on SQLite: the same columns as on
// PostgreSQL, applied_at in microseconds since the Unix epoch.
const sqliteBootstrap = `CREATE TABLE IF NOT EXISTS jetinbox_migrations (
	component  TEXT    NOT NULL,
	version    INTEGER NOT NULL,
	name       TEXT    NOT NULL,
	applied_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
	checksum   TEXT,
	PRIMARY KEY (component, version)
) STRICT`

// ApplySQLite applies the migrations of component that db (a SQLite
// database) has not recorded yet and returns how many it applied. Each file
// runs in its own transaction; SQLite runs DDL transactionally too, so a
// failed file leaves nothing behind. db's transactions must begin
// IMMEDIATE (the write lock first), as sqliteinbox.Open sets up: two
// processes migrating at once then take turns.
func ApplySQLite(ctx context.Context, db *sql.DB, component string, ms []Migration) (int, error) {
	applied := 0
	for _, m := range ms {
		did, err := applyOneSQLite(ctx, db, component, m)
		if err != nil {
			return applied, err
		}
		if did {
			applied++
		}
	}
	return applied, nil
}

func applyOneSQLite(ctx context.Context, db *sql.DB, component string, m Migration) (bool, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	if _, err := tx.ExecContext(ctx, sqliteBootstrap); err != nil {
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	var stored sql.NullString
	err = tx.QueryRowContext(ctx, `SELECT checksum FROM jetinbox_migrations WHERE component = ? AND version = ?`,
		component, m.Version).Scan(&stored)
	switch {
	case err == nil && stored.Valid && stored.String != m.Checksum():
		return false, fmt.Errorf("%w: %s %s was applied with other SQL (checksum %.12s…, the file's is %.12s…): ship a new migration instead",
			ErrEdited, component, m.Name, stored.String, m.Checksum())
	case err == nil:
		return false, nil
	case !errors.Is(err, sql.ErrNoRows):
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return false, fmt.Errorf("migrate %s %s: %w", component, m.Name, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO jetinbox_migrations (component, version, name, checksum) VALUES (?, ?, ?, ?)`,
		component, m.Version, m.Name, m.Checksum()); err != nil {
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("migrate %s: commit: %w", component, err)
	}
	return true, nil
}

// StatusSQLite compares the files of component with what the SQLite
// database db recorded. A database that was never migrated has every file
// pending.
func StatusSQLite(ctx context.Context, db *sql.DB, component string, ms []Migration) ([]State, error) {
	recorded := map[int]sql.NullString{}
	names := map[int]string{}
	rows, err := db.QueryContext(ctx, `SELECT version, name, checksum FROM jetinbox_migrations WHERE component = ?`, component)
	if err == nil {
		for rows.Next() {
			var v int
			var name string
			var sum sql.NullString
			if err := rows.Scan(&v, &name, &sum); err != nil {
				rows.Close()
				return nil, fmt.Errorf("migrate %s: status: %w", component, err)
			}
			recorded[v], names[v] = sum, name
		}
		err = rows.Err()
		rows.Close()
	}
	if err != nil && !strings.Contains(err.Error(), "no such table") { // never migrated
		return nil, fmt.Errorf("migrate %s: status: %w", component, err)
	}
	var out []State
	for _, m := range ms {
		st := State{Component: component, Version: m.Version, Name: m.Name}
		sum, ok := recorded[m.Version]
		st.Applied, st.Pending = ok, !ok
		st.Edited = ok && sum.Valid && sum.String != m.Checksum()
		delete(recorded, m.Version)
		out = append(out, st)
	}
	for v := range recorded {
		out = append(out, State{Component: component, Version: v, Name: names[v], Applied: true, Unknown: true})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// VersionSQLite returns the highest version of component that db recorded,
// and false if db was never migrated.
func VersionSQLite(ctx context.Context, db interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}, component string) (int, bool, error) {
	var have int
	err := db.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM jetinbox_migrations WHERE component = ?`, component).Scan(&have)
	if err != nil && strings.Contains(err.Error(), "no such table") {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("migrate %s: %w", component, err)
	}
	return have, true, nil
}
