package verify

import (
	"context"
	"database/sql"
	"encoding/json"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is the database verify reads the inbox and the ledger from:
// PostgreSQL ([Postgres]) or SQLite ([SQLite]).
type DB interface {
	query(ctx context.Context, q stmt, args ...any) (rows, error)
	queryRow(ctx context.Context, q stmt, args ...any) scanner
}

// stmt is one statement in both dialects: PostgreSQL with $n parameters
// and arrays, SQLite with ?n parameters and arrays passed as JSON.
type stmt struct{ pg, sqlite string }

type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type scanner interface{ Scan(dest ...any) error }

// Postgres is verify's [DB] on a PostgreSQL pool.
func Postgres(pool *pgxpool.Pool) DB { return pgDB{pool} }

type pgDB struct{ pool *pgxpool.Pool }

func (d pgDB) query(ctx context.Context, q stmt, args ...any) (rows, error) {
	return d.pool.Query(ctx, q.pg, args...)
}

func (d pgDB) queryRow(ctx context.Context, q stmt, args ...any) scanner {
	return d.pool.QueryRow(ctx, q.pg, args...)
}

// SQLite is verify's [DB] on a SQLite database.
func SQLite(db *sql.DB) DB { return sqliteDB{db} }

type sqliteDB struct{ db *sql.DB }

// sqliteArgs passes string slices as JSON arrays, for json_each.
func sqliteArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case []string:
			b, _ := json.Marshal(v) // strings always marshal
			a = string(b)
		case []int64:
			b, _ := json.Marshal(v) // numbers always marshal
			a = string(b)
		}
		out[i] = a
	}
	return out
}

func (d sqliteDB) query(ctx context.Context, q stmt, args ...any) (rows, error) {
	r, err := d.db.QueryContext(ctx, q.sqlite, sqliteArgs(args)...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}

func (d sqliteDB) queryRow(ctx context.Context, q stmt, args ...any) scanner {
	return d.db.QueryRowContext(ctx, q.sqlite, sqliteArgs(args)...)
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }
