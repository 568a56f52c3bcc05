// The databases the approaches run on: one fresh database per approach and
// round, on the throwaway PostgreSQL server or as SQLite files.

package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// databases makes the approaches' databases.
type databases interface {
	// create makes database name, migrated, with accounts 1..accounts.
	create(ctx context.Context, name string, accounts int) (*cli.Store, error)
	// url is the database URL of name, for a child process.
	url(name string) string
	// drop removes database name (its store closed).
	drop(ctx context.Context, name string) error
	// settle waits for the server to finish cleaning up after a phase.
	settle(ctx context.Context) error
	// String names the store for the report.
	String() string
	close()
}

func openDatabases(ctx context.Context, store string) (databases, error) {
	switch store {
	case cli.StoreSQLite:
		dir, err := os.MkdirTemp("", "jetinbox-bench-")
		if err != nil {
			return nil, err
		}
		return sqliteDatabases{dir: dir}, nil
	case cli.StorePostgres:
		pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Durable: true})
		if err != nil {
			return nil, err
		}
		return pgDatabases{pg}, nil
	case storePgBouncer:
		pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Durable: true})
		if err != nil {
			return nil, err
		}
		// Server connections enough for every transaction the approaches
		// run at once: the pooler's own cost is measured, not a queue.
		b, err := testenv.StartPgBouncer(ctx, pg, testenv.PgBouncerOptions{PoolSize: 16})
		if err != nil {
			pg.Close()
			return nil, err
		}
		return bouncerDatabases{pgDatabases{pg}, b}, nil
	}
	return nil, fmt.Errorf("-store %q: want postgres, pgbouncer or sqlite", store)
}

// storePgBouncer is bench's -store for PostgreSQL behind a pgbouncer.
const storePgBouncer = "pgbouncer"

// benchDB is a migrated database with accounts 1..accounts on the
// throwaway server, as a pool: the cluster measurements also read
// PostgreSQL's own statistics (WAL, transactions).
func benchDB(ctx context.Context, pg *testenv.Postgres, name string, accounts int) (*pgxpool.Pool, error) {
	s, err := pgDatabases{pg}.create(ctx, name, accounts)
	if err != nil {
		return nil, err
	}
	return s.PG, nil
}

// pgDatabases are databases of a throwaway PostgreSQL server (fsync on).
type pgDatabases struct{ pg *testenv.Postgres }

func (d pgDatabases) create(ctx context.Context, name string, accounts int) (*cli.Store, error) {
	url, err := d.pg.CreateDatabase(ctx, name)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 32
	pginbox.WatchCommits(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return prepare(ctx, &cli.Store{PG: pool}, accounts)
}

func (d pgDatabases) url(name string) string { return d.pg.URL(name) }
func (d pgDatabases) drop(ctx context.Context, name string) error {
	return d.pg.DropDatabase(ctx, name)
}
func (d pgDatabases) settle(ctx context.Context) error { return d.pg.Settle(ctx, 30*time.Second) }
func (d pgDatabases) String() string                   { return "PostgreSQL (fsync on)" }
func (d pgDatabases) close()                           { d.pg.Close() }

// bouncerDatabases are databases of a throwaway PostgreSQL server (fsync
// on) reached through a pgbouncer in transaction pooling mode, as the
// commands reach it: cli.OpenStore finds the pooler and picks the
// statement mode.
type bouncerDatabases struct {
	pgDatabases
	b *testenv.PgBouncer
}

func (d bouncerDatabases) create(ctx context.Context, name string, accounts int) (*cli.Store, error) {
	if _, err := d.pg.CreateDatabase(ctx, name); err != nil {
		return nil, err
	}
	s, err := cli.OpenStore(ctx, d.url(name), 32, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	return prepare(ctx, s, accounts)
}

func (d bouncerDatabases) url(name string) string { return d.b.URL(name) }
func (d bouncerDatabases) String() string {
	return "PostgreSQL (fsync on) through pgbouncer (transaction mode)"
}
func (d bouncerDatabases) close() {
	_ = d.b.Close()
	d.pg.Close()
}

// sqliteDatabases are SQLite files in a temporary directory (WAL,
// synchronous=FULL).
type sqliteDatabases struct{ dir string }

func (d sqliteDatabases) path(name string) string { return filepath.Join(d.dir, name+".db") }

func (d sqliteDatabases) create(ctx context.Context, name string, accounts int) (*cli.Store, error) {
	s, err := cli.OpenStore(ctx, d.url(name), 0, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	return prepare(ctx, s, accounts)
}

func (d sqliteDatabases) url(name string) string { return "sqlite://" + d.path(name) }

func (d sqliteDatabases) drop(_ context.Context, name string) error {
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(d.path(name) + suffix); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}

func (d sqliteDatabases) settle(context.Context) error { return nil }
func (d sqliteDatabases) String() string               { return "SQLite (WAL, synchronous=FULL)" }
func (d sqliteDatabases) close()                       { _ = os.RemoveAll(d.dir) }

func prepare(ctx context.Context, s *cli.Store, accounts int) (*cli.Store, error) {
	if _, _, err := s.Migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if s.PG != nil {
		// The outbox approach's follow-ups go there.
		if _, err := s.Outbox().Migrate(ctx); err != nil {
			s.Close()
			return nil, err
		}
	}
	if err := s.SeedAccounts(ctx, accounts); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// queryRow runs a one-row query on either store; q is written with $1 and
// works on both.
func queryRow(ctx context.Context, s *cli.Store, q string, dest ...any) error {
	if s.SQLite != nil {
		return s.SQLite.QueryRowContext(ctx, q).Scan(dest...)
	}
	return s.PG.QueryRow(ctx, q).Scan(dest...)
}
