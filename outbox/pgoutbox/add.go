// Package pgoutbox keeps the outbox in PostgreSQL: [Add] and [AddFresh]
// write a transaction's intents in that transaction (a pgx.Tx), and a
// [Store] (New, or pginbox.Store.Outbox for the inbox's database) carries
// the schema, retention and backlog, and is the [outbox.Source] a relay
// ([outbox.NewRelay]) takes the rows from. See package outbox for the
// design.
package pgoutbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/pgcopy"
)

// Querier is what [Add] writes and reads through, with one query for the
// whole batch: a pgx.Tx, so that the intent commits or rolls back with the
// effect it follows from. *pgx.Conn and *pgxpool.Pool satisfy it too, for
// a write of its own.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// insertSQL inserts the intents that are new and returns their IDs. It
// never raises on a duplicate ID: the transaction stays usable.
const insertSQL = `INSERT INTO outbox (id, subject, payload, fingerprint, parent_id)
SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::text[])
ON CONFLICT (id) DO NOTHING
RETURNING id`

// existingSQL reads the rows of IDs the insert found there. It is a
// statement of its own so that, under READ COMMITTED, it sees a row that a
// concurrent transaction committed while the insert waited for it.
const existingSQL = `SELECT id, subject, fingerprint FROM outbox WHERE id = ANY($1)`

// Add writes intents to the outbox in tx, the transaction of the effect or
// the row they follow from: they are published if and only if it commits.
// A relay ([outbox.Relay]) publishes them with Nats-Msg-Id = inbox.Intent.ID.
//
// An ID already in the outbox with the same subject and payload is a repeat
// of the same work and is left alone (no second message); with another
// subject or payload Add returns an error wrapping [inbox.ErrConflict]: roll the
// transaction back (or back to a savepoint), since the call's other new rows
// are in it. A sent row is remembered until retention deletes it (see
// [Store.Prune]). Bad input wraps [inbox.ErrBadIntent] ([inbox.Intent.Validate]); nothing is written then either.
// Two intents of one call with the same ID count as one if they are equal.
func Add(ctx context.Context, tx Querier, intents ...inbox.Intent) error {
	if len(intents) == 0 {
		return nil
	}
	ids := make([]string, 0, len(intents))
	subjects := make([]string, 0, len(intents))
	payloads := make([][]byte, 0, len(intents))
	fps := make([][]byte, 0, len(intents))
	parents := make([]string, 0, len(intents))
	seen := make(map[string]int, len(intents))
	for i := range intents {
		in := &intents[i]
		if err := in.Validate(); err != nil {
			return err
		}
		fp := inbox.Fingerprint(in.Payload)
		if j, ok := seen[in.ID]; ok {
			if subjects[j] != in.Subject || !bytes.Equal(fps[j], fp[:]) {
				return fmt.Errorf("%w: %s twice in one call, with different contents", inbox.ErrConflict, in.ID)
			}
			continue
		}
		seen[in.ID] = len(ids)
		payload := in.Payload
		if payload == nil {
			payload = []byte{} // the column is NOT NULL; nil and empty are one payload
		}
		ids, subjects, payloads = append(ids, in.ID), append(subjects, in.Subject), append(payloads, payload)
		fps, parents = append(fps, fp[:]), append(parents, in.Parent)
	}
	rows, err := tx.Query(ctx, insertSQL, ids, subjects, payloads, fps, parents)
	if err != nil {
		return fmt.Errorf("outbox: add: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("outbox: add: %w", err)
	}
	if len(inserted) == len(ids) {
		return nil
	}
	there := make(map[string]bool, len(ids))
	for _, id := range ids {
		there[id] = true
	}
	for _, id := range inserted {
		delete(there, id)
	}
	repeat := make([]string, 0, len(there))
	for id := range there {
		repeat = append(repeat, id)
	}
	rows, err = tx.Query(ctx, existingSQL, repeat)
	if err != nil {
		return fmt.Errorf("outbox: add: %w", err)
	}
	defer rows.Close()
	var conflicts []string
	for rows.Next() {
		var id, subject string
		var fp []byte
		if err := rows.Scan(&id, &subject, &fp); err != nil {
			return fmt.Errorf("outbox: add: %w", err)
		}
		delete(there, id)
		if j := seen[id]; subject != subjects[j] || !bytes.Equal(fp, fps[j]) {
			conflicts = append(conflicts, id)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: add: %w", err)
	}
	for id := range there {
		// Neither inserted nor there: retention deleted it between the
		// two statements. Emitting it again could send a second message.
		conflicts = append(conflicts, id)
	}
	if len(conflicts) > 0 {
		slices.Sort(conflicts)
		return fmt.Errorf("%w: %s (%d in all); roll the transaction back", inbox.ErrConflict, conflicts[0], len(conflicts))
	}
	return nil
}

// ErrNotFresh is returned by [AddFresh] when an ID was in the outbox
// already. The statement failed and aborted the transaction: roll it back
// and add the intents with [Add].
var ErrNotFresh = errors.New("outbox: an intent added as fresh is in the outbox already")

// freshThreshold is the number of intents from which AddFresh copies.
const freshThreshold = 64

var copyBufs = sync.Pool{New: func() any { return pgcopy.New(5, 1024, 128) }}

// AddFresh is [Add] for intents whose IDs cannot be in the outbox yet, such
// as follow-ups derived from messages the inbox claimed fresh in tx: from 64
// intents on it writes them with one COPY, which is cheaper than Add's
// INSERT … ON CONFLICT, instead of checking each ID. If an ID is there after
// all (the parent's inbox row was pruned and the parent replayed, say), the
// COPY fails, tx is aborted, and AddFresh returns an error wrapping
// [ErrNotFresh]: roll back and run the work again with Add, which tells a
// repeat from a conflict. Below 64 intents it is Add.
func AddFresh(ctx context.Context, tx pgx.Tx, intents ...inbox.Intent) error {
	if len(intents) < freshThreshold {
		return Add(ctx, tx, intents...)
	}
	w := copyBufs.Get().(*pgcopy.Buffer)
	w.Reset(5)
	seen := make(map[string]bool, len(intents))
	for i := range intents {
		in := &intents[i]
		if err := in.Validate(); err != nil {
			copyBufs.Put(w)
			return err
		}
		if seen[in.ID] {
			// Repeats inside one call: let Add sort them out.
			copyBufs.Put(w)
			return Add(ctx, tx, intents...)
		}
		seen[in.ID] = true
		fp := inbox.Fingerprint(in.Payload)
		w.Row()
		w.Text(in.ID)
		w.Text(in.Subject)
		w.Bytea(in.Payload)
		w.Bytea(fp[:])
		w.Text(in.Parent)
	}
	if _, err := w.CopyTo(ctx, tx, "outbox", "id, subject, payload, fingerprint, parent_id"); err != nil {
		// pgconn may still be reading w: leave it to the GC.
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
			return fmt.Errorf("%w: %w", ErrNotFresh, err)
		}
		return fmt.Errorf("outbox: add: %w", err)
	}
	copyBufs.Put(w)
	return nil
}
