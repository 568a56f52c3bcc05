package pginbox

import (
	"errors"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// isRetryableTx reports deadlocks and serialization failures, which a retry
// of the same transaction resolves.
func isRetryableTx(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// isDataError reports errors that the same input will always cause: data
// exceptions (class 22) and integrity violations (class 23).
func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && len(pgErr.Code) == 5 && (pgErr.Code[:2] == "22" || pgErr.Code[:2] == "23")
}

// isConnError reports errors that say the connection or the server is gone,
// not that one message failed: connection exceptions (class 08), the
// server shutting down (57P01-57P05), network errors, and a write refused
// by a read-only node (25006): after a failover the old primary is a
// standby, and the connection, not the message, points at the wrong node.
// A statement timeout (57014) is the message's own problem and is retried
// for that message.
func isConnError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code[:2] == "08" || strings.HasPrefix(pgErr.Code, "57P") || pgErr.Code == "25006"
	}
	var netErr net.Error
	return pgconn.SafeToRetry(err) || errors.As(err, &netErr) || errors.Is(err, pgx.ErrTxClosed)
}
