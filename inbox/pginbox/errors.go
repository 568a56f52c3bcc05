package pginbox

import (
	"errors"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlState returns the SQLSTATE of a server error in err's chain, "" if
// there is none. A PgError may carry any Code (a pooler or a proxy makes
// up its own errors, a test builds them by hand): callers look at a code
// only through this, never slice it unchecked.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr != nil {
		return pgErr.Code
	}
	return ""
}

// class is the two-character class of a SQLSTATE, "" for a code too short
// to have one.
func class(code string) string {
	if len(code) < 2 {
		return ""
	}
	return code[:2]
}

// isRetryableTx reports deadlocks and serialization failures, which a retry
// of the same transaction resolves.
func isRetryableTx(err error) bool {
	code := sqlState(err)
	return code == "40P01" || code == "40001"
}

// isDataError reports errors that the same input will always cause: data
// exceptions (class 22) and integrity violations (class 23).
func isDataError(err error) bool {
	code := sqlState(err)
	return len(code) == 5 && (class(code) == "22" || class(code) == "23")
}

// isConnError reports errors that say the connection, the server or the
// deployment is at fault, not one message: connection exceptions (class
// 08, among them 08P01, which a pooler in statement mode raises for every
// transaction), the server shutting down (57P01-57P05), a write refused by
// a read-only node (25006: after a failover the old primary is a standby,
// and the connection, not the message, points at the wrong node), the
// schema or a grant missing (class 42: undefined table or function,
// insufficient privilege 42501, and the rest of that class, which no
// message's content can cause; 3F000, an invalid schema name), a
// database or login that is gone (3D000, class 28), the server out of
// resources (class 53: disk full, out of memory, too many connections) or
// failing in its own system calls (class 58), and network errors. A
// statement timeout (57014) is the message's own problem and is retried
// for that message.
func isConnError(err error) bool {
	if code := sqlState(err); code != "" {
		switch class(code) {
		case "08", "28", "42", "53", "58":
			return true
		}
		return strings.HasPrefix(code, "57P") || code == "25006" || code == "3F000" || code == "3D000"
	}
	var netErr net.Error
	return pgconn.SafeToRetry(err) || errors.As(err, &netErr) || errors.Is(err, pgx.ErrTxClosed)
}
