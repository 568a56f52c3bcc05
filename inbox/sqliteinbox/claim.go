package sqliteinbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jetinbox/jetinbox/inbox"
)

const (
	// claimSQL inserts one claim; a row already there is left as it is
	// and reported by RowsAffected 0. The transaction holds the file's
	// write lock (BEGIN IMMEDIATE), so no other transaction can claim
	// between this statement and the commit.
	claimSQL = `INSERT INTO inbox (scope, message_id, fingerprint, stream_seq, subject) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (scope, message_id) DO NOTHING`
	// existingSQL reads a row that was already there.
	existingSQL = `SELECT fingerprint, status, coalesce(reason, ''), stream_seq FROM inbox WHERE scope = ? AND message_id = ?`
)

// ClaimTx claims messages for scope inside the caller's SQLite transaction
// and returns one result per claim, in order, as [inbox.ClaimTx] does on
// PostgreSQL: fresh, duplicate (same fingerprint) or conflict (another
// fingerprint), and copies of an ID earlier in the slice resolved with the
// first. The rows become permanent only when tx commits; apply the effects
// of the fresh claims in tx, commit, then ack.
//
// Claims must have valid IDs (see [inbox.ValidateID]). tx must hold the
// write lock from its start (BEGIN IMMEDIATE, as [Open] sets up).
func ClaimTx(ctx context.Context, tx *sql.Tx, scope string, claims []inbox.Claim) ([]inbox.ClaimResult, error) {
	res := make([]inbox.ClaimResult, len(claims))
	if len(claims) == 0 {
		return res, nil
	}
	if err := inbox.ValidateID(scope); err != nil {
		return nil, fmt.Errorf("inbox: scope: %w", err)
	}
	first := make(map[string]int, len(claims))
	for i := range claims {
		if err := inbox.ValidateID(claims[i].ID); err != nil {
			return nil, fmt.Errorf("inbox: claim %d: %w", i, err)
		}
	}
	ins, err := tx.PrepareContext(ctx, claimSQL)
	if err != nil {
		return nil, fmt.Errorf("inbox: claim: %w", err)
	}
	defer ins.Close()
	var sel *sql.Stmt
	for i := range claims {
		c := &claims[i]
		if j, dup := first[c.ID]; dup {
			res[i] = inbox.ClaimResult{State: inbox.ClaimDuplicate, InBatch: true, First: j}
			if claims[j].Fingerprint != c.Fingerprint {
				res[i].State = inbox.ClaimConflict
			}
			continue
		}
		first[c.ID] = i
		r, err := ins.ExecContext(ctx, scope, c.ID, c.Fingerprint[:], int64(c.StreamSeq), c.Subject)
		if err != nil {
			return nil, fmt.Errorf("inbox: claim: %w", err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return nil, fmt.Errorf("inbox: claim: %w", err)
		}
		if n == 1 {
			res[i].State = inbox.ClaimFresh
			continue
		}
		if sel == nil {
			if sel, err = tx.PrepareContext(ctx, existingSQL); err != nil {
				return nil, fmt.Errorf("inbox: claim: read existing: %w", err)
			}
			defer sel.Close()
		}
		var fp []byte
		var status, reason string
		var seq int64
		if err := sel.QueryRowContext(ctx, scope, c.ID).Scan(&fp, &status, &reason, &seq); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				// Not inserted yet not there: it cannot happen under the
				// unique key; refuse to guess rather than report a false
				// fresh claim.
				return nil, fmt.Errorf("inbox: claim: row %q neither inserted nor found", c.ID)
			}
			return nil, fmt.Errorf("inbox: claim: read existing: %w", err)
		}
		res[i] = inbox.ClaimResult{State: inbox.ClaimDuplicate, PriorStatus: inbox.RowStatus(status), PriorReason: reason, PriorSeq: uint64(seq)}
		if !bytes.Equal(fp, c.Fingerprint[:]) {
			res[i].State = inbox.ClaimConflict
		}
	}
	return res, nil
}
