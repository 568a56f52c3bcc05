// Package pgcopy writes rows in PostgreSQL's binary COPY format into one
// reusable buffer and sends them with pgconn's CopyFrom: no describe round
// trip, no []any per row, no boxing. It covers the few types the inbox and
// the ledger write (text, bytea, bigint).
//
// It stays because it measures clearly faster than pgx's CopyFrom, which
// caches the statement description since pgx 5.12: BenchmarkCopy, 6,000
// inbox rows a copy, took 6.4-9.4 ms and 16 allocations against 10-12 ms
// and 17,797 allocations (580 KB) for CopyFrom on a 2-core machine.
package pgcopy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// header is the binary COPY signature, flags (0) and header extension
// length (0).
const header = "PGCOPY\n\377\r\n\000\x00\x00\x00\x00\x00\x00\x00\x00"

// Buffer accumulates rows. The zero value is not ready: use [New].
type Buffer struct {
	b    []byte
	cols int
	left int // fields still owed by the current row
	rows int
}

// New returns a buffer for rows of cols fields, sized for about rows rows of
// rowBytes bytes each.
func New(cols, rows, rowBytes int) *Buffer {
	b := make([]byte, 0, len(header)+rows*(2+cols*4+rowBytes)+2)
	return &Buffer{b: append(b, header...), cols: cols}
}

// Row starts a row; exactly cols fields must follow.
func (w *Buffer) Row() {
	if w.left != 0 {
		panic(fmt.Sprintf("pgcopy: row %d has %d fields missing", w.rows, w.left))
	}
	w.b = binary.BigEndian.AppendUint16(w.b, uint16(w.cols))
	w.left = w.cols
	w.rows++
}

func (w *Buffer) field(n int) {
	if w.left == 0 {
		panic(fmt.Sprintf("pgcopy: row %d has too many fields", w.rows))
	}
	w.left--
	w.b = binary.BigEndian.AppendUint32(w.b, uint32(n))
}

// Text appends a text field. s must be valid UTF-8 without NUL bytes, or
// the server rejects the COPY.
func (w *Buffer) Text(s string) {
	w.field(len(s))
	w.b = append(w.b, s...)
}

// Bytea appends a bytea field.
func (w *Buffer) Bytea(p []byte) {
	w.field(len(p))
	w.b = append(w.b, p...)
}

// Int8 appends a bigint field.
func (w *Buffer) Int8(v int64) {
	w.field(8)
	w.b = binary.BigEndian.AppendUint64(w.b, uint64(v))
}

// Null appends a NULL field.
func (w *Buffer) Null() {
	if w.left == 0 {
		panic(fmt.Sprintf("pgcopy: row %d has too many fields", w.rows))
	}
	w.left--
	w.b = binary.BigEndian.AppendUint32(w.b, math.MaxUint32)
}

// Rows is how many rows the buffer holds.
func (w *Buffer) Rows() int { return w.rows }

// Bytes returns the COPY data including the trailer. The buffer is complete
// only when every row has all its fields.
func (w *Buffer) Bytes() []byte {
	if w.left != 0 {
		panic(fmt.Sprintf("pgcopy: row %d has %d fields missing", w.rows, w.left))
	}
	// The trailer goes past len(w.b): the next row overwrites it.
	return binary.BigEndian.AppendUint16(w.b, math.MaxUint16)
}

// Reset empties the buffer, keeping its memory, for rows of cols fields.
func (w *Buffer) Reset(cols int) {
	w.b = append(w.b[:0], header...)
	w.cols, w.left, w.rows = cols, 0, 0
}

// CopyTo sends the rows to table (columns in field order, names already
// safe SQL identifiers) inside tx and returns how many rows the server took.
func (w *Buffer) CopyTo(ctx context.Context, tx pgx.Tx, table string, columns string) (int64, error) {
	sql := "COPY " + table + " (" + columns + ") FROM STDIN BINARY"
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(w.Bytes()), sql)
	if err != nil {
		return 0, err
	}
	if tag.RowsAffected() != int64(w.rows) {
		return tag.RowsAffected(), fmt.Errorf("pgcopy: server took %d rows of %d", tag.RowsAffected(), w.rows)
	}
	return tag.RowsAffected(), nil
}
