package console

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Safe turns hostile bytes into text a page can show: at most max bytes
// of b are shown (the cut is said), invalid UTF-8 bytes become \xNN,
// control characters other than newline and tab become \u escapes, and
// so do the bidirectional controls that could make text read otherwise
// than it is (U+202A–U+202E, U+2066–U+2069, U+200E/F, U+061C). The result
// is still escaped by html/template when shown.
func Safe(b []byte, max int) string {
	var sb strings.Builder
	cut := false
	if len(b) > max {
		b, cut = b[:max], true
	}
	sb.Grow(len(b))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&sb, `\x%02x`, b[0])
		case r == '\n' || r == '\t':
			sb.WriteRune(r)
		case unicode.IsControl(r) || isBidi(r):
			fmt.Fprintf(&sb, `\u%04x`, r)
		default:
			sb.Write(b[:n])
		}
		b = b[n:]
	}
	if cut {
		sb.WriteString("… (cut at " + strconv.Itoa(max) + " bytes)")
	}
	return sb.String()
}

func isBidi(r rune) bool {
	return (r >= 0x202A && r <= 0x202E) || (r >= 0x2066 && r <= 0x2069) || r == 0x200E || r == 0x200F || r == 0x061C
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t).Round(time.Second)
	if d < 0 {
		return "just now"
	}
	return d.String() + " ago"
}

func pct(a, b float64) string {
	if b <= 0 {
		return "no limit"
	}
	return strconv.FormatFloat(100*a/b, 'f', 1, 64) + "%"
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// db reads the inbox's database, PostgreSQL or SQLite, with the
// PostgreSQL spelling of each query ($1 placeholders, rewritten to ?1 for
// SQLite).
type db struct {
	name string // the shard's, on a sharded pipeline
	pg   *pgxpool.Pool
	lite *sql.DB
}

type rowsIter interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

type sqlRows struct{ *sql.Rows }

func (db db) query(ctx context.Context, q string, args ...any) (rowsIter, func(), error) {
	if db.pg != nil {
		rows, err := db.pg.Query(ctx, q, args...)
		if err != nil {
			return nil, nil, err
		}
		return rows, rows.Close, nil
	}
	rows, err := db.lite.QueryContext(ctx, strings.ReplaceAll(q, "$", "?"), args...)
	if err != nil {
		return nil, nil, err
	}
	return sqlRows{rows}, func() { _ = rows.Close() }, nil
}

// missingTable reports an error for a table this database does not have
// (the outbox or the key table of a store that never migrated them).
func missingTable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "42P01"
	}
	return err != nil && strings.Contains(err.Error(), "no such table")
}

// when turns a time column into a time: PostgreSQL's timestamptz, or
// SQLite's microseconds since the epoch.
func when(v any) time.Time {
	switch t := v.(type) {
	case time.Time:
		return t
	case int64:
		return time.UnixMicro(t)
	}
	return time.Time{}
}
