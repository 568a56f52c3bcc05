package pginbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/internal/pgcopy"
)

// claimSQL inserts every claim in one statement, in ID byte order (COLLATE
// "C", the order Go sorts in for the COPY claim, whatever the database's
// locale) so that two transactions claiming overlapping sets lock keys in
// the same order and cannot deadlock, and returns the ordinals of the claims that were NOT
// inserted: usually none. A row held by a concurrent transaction makes the
// INSERT wait; if that transaction commits, the claim conflicts.
const claimSQL = `WITH t AS (
	SELECT * FROM unnest($2::text[], $3::bytea[], $4::bigint[], $5::text[]) WITH ORDINALITY AS t(id, fp, seq, subj, ord)
), ins AS (
	INSERT INTO inbox (scope, message_id, fingerprint, stream_seq, subject)
	SELECT $1, t.id, t.fp, t.seq, t.subj FROM t ORDER BY t.id COLLATE "C"
	ON CONFLICT (scope, message_id) DO NOTHING
	RETURNING message_id
)
SELECT t.ord FROM t WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.message_id = t.id)`

// existingSQL reads the rows that were already there. It runs as a new
// statement, so under READ COMMITTED it sees rows committed by a concurrent
// transaction the claim waited for.
const existingSQL = `SELECT message_id, fingerprint, subject, status, coalesce(reason, ''), stream_seq
FROM inbox WHERE scope = $1 AND message_id = ANY($2::text[])`

// ClaimTx claims messages for scope inside the caller's transaction, with one
// INSERT for the whole slice (plus one SELECT when some were already there).
// It returns one result per claim, in order. The rows become permanent only
// when tx commits; the caller applies the effects of the fresh claims in the
// same transaction, before committing, and acks only after the commit.
//
// Claims must have valid IDs (see [ValidateID]).
func ClaimTx(ctx context.Context, tx pgx.Tx, scope string, claims []driver.Claim) ([]driver.ClaimResult, error) {
	res := make([]driver.ClaimResult, len(claims))
	if len(claims) == 0 {
		return res, nil
	}
	if err := inbox.ValidateID(scope); err != nil {
		return nil, fmt.Errorf("inbox: scope: %w", err)
	}
	n := len(claims)
	ids := make([]string, 0, n)
	fps := make([][]byte, 0, n)
	seqs := make([]int64, 0, n)
	subjects := make([]string, 0, n)
	// pos[k] is the index in claims of the k-th unique ID sent.
	pos := make([]int, 0, n)
	var first map[string]int
	if n > 1 {
		first = make(map[string]int, n)
	}
	for i := range claims {
		c := &claims[i]
		if err := inbox.ValidateID(c.ID); err != nil {
			return nil, fmt.Errorf("inbox: claim %d: %w", i, err)
		}
		if first != nil {
			if j, dup := first[c.ID]; dup {
				res[i] = driver.ClaimResult{State: driver.ClaimDuplicate, InBatch: true, First: j}
				if !c.SameIntent(claims[j].Fingerprint[:], claims[j].Subject) {
					res[i].State = driver.ClaimConflict
				}
				continue
			}
			first[c.ID] = i
		}
		ids = append(ids, c.ID)
		fps = append(fps, c.Fingerprint[:])
		seqs = append(seqs, int64(c.StreamSeq))
		subjects = append(subjects, c.Subject)
		pos = append(pos, i)
		res[i].State = driver.ClaimFresh
	}

	rows, err := tx.Query(ctx, claimSQL, scope, ids, fps, seqs, subjects)
	if err != nil {
		return nil, fmt.Errorf("inbox: claim: %w", err)
	}
	var taken []string
	for rows.Next() {
		var ord int64
		if err := rows.Scan(&ord); err != nil {
			rows.Close()
			return nil, fmt.Errorf("inbox: claim: %w", err)
		}
		taken = append(taken, ids[ord-1])
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: claim: %w", err)
	}
	if len(taken) == 0 {
		return res, nil
	}

	rows, err = tx.Query(ctx, existingSQL, scope, taken)
	if err != nil {
		return nil, fmt.Errorf("inbox: claim: read existing: %w", err)
	}
	defer rows.Close()
	byID := make(map[string]driver.ClaimResult, len(taken))
	type row struct {
		fp      []byte
		subject string
	}
	stored := make(map[string]row, len(taken))
	for rows.Next() {
		var id, subject, status, reason string
		var fp []byte
		var seq int64
		if err := rows.Scan(&id, &fp, &subject, &status, &reason, &seq); err != nil {
			return nil, fmt.Errorf("inbox: claim: read existing: %w", err)
		}
		byID[id] = driver.ClaimResult{State: driver.ClaimDuplicate, PriorStatus: driver.RowStatus(status), PriorReason: reason, PriorSeq: uint64(seq), PriorSubject: subject}
		stored[id] = row{fp, subject}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: claim: read existing: %w", err)
	}
	for k, id := range ids {
		r, ok := byID[id]
		if !ok {
			continue
		}
		i := pos[k]
		if st := stored[id]; !claims[i].SameIntent(st.fp, st.subject) {
			r.State = driver.ClaimConflict
		}
		res[i] = r
	}
	for _, id := range taken {
		if _, ok := byID[id]; !ok {
			// Not inserted yet not there: it cannot happen under the unique
			// key; refuse to guess rather than report a false fresh claim.
			return nil, fmt.Errorf("inbox: claim: row %q neither inserted nor found", id)
		}
	}
	return res, nil
}

// copyClaimThreshold is the batch size from which a batch whose messages
// are all first deliveries is claimed with COPY: one binary stream instead
// of a statement that decodes arrays, sorts, checks each key for a
// conflict and reports back. Smaller batches keep the one-statement claim,
// which is what low-load latency is made of.
const copyClaimThreshold = 64

// claimColumns are the inbox columns claimCopy writes, in field order.
const claimColumns = "scope, message_id, fingerprint, stream_seq, subject"

var copyBufs = sync.Pool{New: func() any { return pgcopy.New(5, 1024, 96) }}

// errCopyClaim says the COPY claim met an ID already there (23505): the
// transaction is aborted, and the batch must be claimed again the careful
// way in a new one.
var errCopyClaim = driver.ErrClaimedBefore

// claimCopy inserts every claim with COPY, in ID byte order (order lists
// claim indexes sorted by ID), the order [ClaimTx] locks keys in, so that
// concurrent batches queue instead of deadlocking. It succeeds only if every
// row is new; a duplicate key returns errCopyClaim wrapping the server's
// error, and any error leaves tx unusable. Claims must have unique, valid
// IDs.
func claimCopy(ctx context.Context, tx pgx.Tx, scope string, claims []driver.Claim, order []int) (err error) {
	w := copyBufs.Get().(*pgcopy.Buffer)
	defer func() {
		// After some failures pgconn returns before its writer goroutine
		// has finished reading the buffer: never reuse it then.
		if err == nil {
			copyBufs.Put(w)
		}
	}()
	w.Reset(5)
	for _, i := range order {
		c := &claims[i]
		w.Row()
		w.Text(scope)
		w.Text(c.ID)
		w.Bytea(c.Fingerprint[:])
		w.Int8(int64(c.StreamSeq))
		w.Text(c.Subject)
	}
	if _, err := w.CopyTo(ctx, tx, "inbox", claimColumns); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return fmt.Errorf("%w: %w", errCopyClaim, err)
		}
		return fmt.Errorf("inbox: claim: %w", err)
	}
	return nil
}
