package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/internal/pgcopy"
)

// Claim is one message to claim: its identity, its payload's fingerprint
// and its subject.
type Claim struct {
	ID          string
	Fingerprint [32]byte
	// Subject is part of the intent's identity: a repeat of an ID must
	// match it as well as the payload, or it is a conflict (an effect that
	// routes by subject would otherwise never see the second one). Empty
	// when the transport has none.
	Subject string
	// StreamSeq is stored with the row for operators. Optional.
	StreamSeq uint64
}

// SameIntent reports whether a stored row's fingerprint and subject are
// those of c: a repeat of the same intent, not a reuse of its ID.
func (c *Claim) SameIntent(fingerprint []byte, subject string) bool {
	return bytes.Equal(fingerprint, c.Fingerprint[:]) && subject == c.Subject
}

// sameClaim reports whether two claims of one ID are the same intent.
func sameClaim(a, b *Claim) bool { return a.Fingerprint == b.Fingerprint && a.Subject == b.Subject }

// ClaimState says whether a claim is new.
type ClaimState uint8

// The states a claim can end in.
const (
	// ClaimFresh: the row is new in this transaction; apply the effect in
	// the same transaction.
	ClaimFresh ClaimState = iota + 1
	// ClaimDuplicate: the row existed with the same fingerprint (or the ID
	// appeared earlier in the same call). Do nothing.
	ClaimDuplicate
	// ClaimConflict: the row existed with a different fingerprint (or the ID
	// appeared earlier in the same call with a different one). Do not apply.
	ClaimConflict
)

// String returns the state's name: fresh, duplicate or conflict.
func (s ClaimState) String() string {
	switch s {
	case ClaimFresh:
		return "fresh"
	case ClaimDuplicate:
		return "duplicate"
	case ClaimConflict:
		return "conflict"
	}
	return fmt.Sprintf("ClaimState(%d)", uint8(s))
}

// RowStatus is an inbox row's status, as its status column stores it.
type RowStatus string

// The statuses an inbox row can have.
const (
	// RowApplied: the message's effect committed with the row.
	RowApplied RowStatus = "applied"
	// RowRejected: the message can never be applied; the row's reason says
	// why.
	RowRejected RowStatus = "rejected"
)

// ClaimResult is the result of one claim.
type ClaimResult struct {
	State ClaimState
	// PriorStatus and PriorReason are the stored row's status and reason,
	// for duplicates and conflicts found in the table; PriorStatus is empty
	// otherwise.
	PriorStatus RowStatus
	PriorReason string
	// PriorSeq is the stored row's stream sequence: the message that
	// claimed it (0 if it was not given).
	PriorSeq uint64
	// PriorSubject is the stored row's subject, for duplicates and
	// conflicts found in the table.
	PriorSubject string
	// InBatch is true when the duplicate or conflict was with an earlier
	// claim of the same call rather than with a stored row; First is that
	// claim's index. Such a claim shares the first one's fate: if the first
	// is not committed, neither is this one.
	InBatch bool
	First   int
}

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
func ClaimTx(ctx context.Context, tx pgx.Tx, scope string, claims []Claim) ([]ClaimResult, error) {
	res := make([]ClaimResult, len(claims))
	if len(claims) == 0 {
		return res, nil
	}
	if err := ValidateID(scope); err != nil {
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
		if err := ValidateID(c.ID); err != nil {
			return nil, fmt.Errorf("inbox: claim %d: %w", i, err)
		}
		if first != nil {
			if j, dup := first[c.ID]; dup {
				res[i] = ClaimResult{State: ClaimDuplicate, InBatch: true, First: j}
				if !sameClaim(&claims[j], c) {
					res[i].State = ClaimConflict
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
		res[i].State = ClaimFresh
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
	byID := make(map[string]ClaimResult, len(taken))
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
		byID[id] = ClaimResult{State: ClaimDuplicate, PriorStatus: RowStatus(status), PriorReason: reason, PriorSeq: uint64(seq), PriorSubject: subject}
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
			r.State = ClaimConflict
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

// claimEach claims one message at a time, each under a savepoint, so that a
// claim the database refuses (a data error the checks before the claim did
// not catch) rolls back alone: refused[i] is its permanent error, and the
// other claims stand. Copies of an ID earlier in the slice are resolved
// the way [ClaimTx] does.
func (p *ProcessorOf[TX]) claimEach(ctx context.Context, tx TX, claims []Claim) (res []ClaimResult, refused []error, err error) {
	st := p.store
	res = make([]ClaimResult, len(claims))
	refused = make([]error, len(claims))
	first := make(map[string]int, len(claims))
	for i := range claims {
		c := &claims[i]
		if j, dup := first[c.ID]; dup {
			res[i] = ClaimResult{State: ClaimDuplicate, InBatch: true, First: j}
			if !sameClaim(&claims[j], c) {
				res[i].State = ClaimConflict
			}
			continue
		}
		first[c.ID] = i
		if err := st.Savepoint(ctx, tx, "SAVEPOINT jetinbox_claim"); err != nil {
			return nil, nil, fmt.Errorf("inbox: savepoint: %w", err)
		}
		r, err := st.Claim(ctx, tx, p.cfg.Scope, claims[i:i+1])
		if err != nil {
			if rerr := st.Savepoint(ctx, tx, "ROLLBACK TO SAVEPOINT jetinbox_claim"); rerr != nil {
				return nil, nil, fmt.Errorf("inbox: rollback to savepoint: %w", rerr)
			}
			if st.Classify(err) != ErrorData {
				return nil, nil, err
			}
			refused[i] = Permanent(fmt.Errorf("%w: %w", ErrClaimRefused, err))
		} else {
			res[i] = r[0]
		}
		if err := st.Savepoint(ctx, tx, "RELEASE SAVEPOINT jetinbox_claim"); err != nil {
			return nil, nil, fmt.Errorf("inbox: release savepoint: %w", err)
		}
	}
	return res, refused, nil
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
var errCopyClaim = ErrClaimedBefore

// claimCopy inserts every claim with COPY, in ID byte order (order lists
// claim indexes sorted by ID), the order [ClaimTx] locks keys in, so that
// concurrent batches queue instead of deadlocking. It succeeds only if every
// row is new; a duplicate key returns errCopyClaim wrapping the server's
// error, and any error leaves tx unusable. Claims must have unique, valid
// IDs.
func claimCopy(ctx context.Context, tx pgx.Tx, scope string, claims []Claim, order []int) (err error) {
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

// sortedUnique returns the indexes of claims sorted by ID, or nil if some
// ID appears twice.
func sortedUnique(claims []Claim) []int {
	order := make([]int, len(claims))
	for i := range order {
		order[i] = i
	}
	cmp := func(a, b int) int { return strings.Compare(claims[a].ID, claims[b].ID) }
	if !slices.IsSortedFunc(order, cmp) {
		slices.SortFunc(order, cmp)
	}
	for k := 1; k < len(order); k++ {
		if claims[order[k-1]].ID == claims[order[k]].ID {
			return nil
		}
	}
	return order
}
