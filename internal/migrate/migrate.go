// Package migrate applies versioned SQL files embedded in a package, one
// transaction per file, under an advisory lock so concurrent starters agree.
package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
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
)`

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
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM jetinbox_migrations WHERE component = $1 AND version = $2)`,
		component, m.Version).Scan(&exists); err != nil {
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	if exists {
		return false, nil
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return false, fmt.Errorf("migrate %s %s: %w", component, m.Name, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO jetinbox_migrations (component, version, name) VALUES ($1, $2, $3)`,
		component, m.Version, m.Name); err != nil {
		return false, fmt.Errorf("migrate %s: %w", component, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("migrate %s: commit: %w", component, err)
	}
	return true, nil
}
