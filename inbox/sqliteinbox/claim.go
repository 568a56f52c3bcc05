package sqliteinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
)

// existingSQL reads a row that was already there.
const existingSQL = `SELECT fingerprint, subject, status, coalesce(reason, ''), stream_seq FROM inbox WHERE scope = ? AND message_id = ?`

// claimChunk is how many claims one INSERT carries (5 parameters each):
// one statement per 256 messages instead of one per message.
const claimChunk = 256

// values returns "(?, ?, …), …": rows groups of cols placeholders.
func values(rows, cols int) string {
	one := "(" + strings.Repeat("?, ", cols-1) + "?)"
	return strings.Repeat(one+", ", rows-1) + one
}

// ClaimTx claims messages for scope inside the caller's SQLite transaction
// and returns one result per claim, in order, as [pginbox.ClaimTx] does on
// PostgreSQL: fresh, duplicate (same fingerprint) or conflict (another
// fingerprint), and copies of an ID earlier in the slice resolved with the
// first. The rows become permanent only when tx commits; apply the effects
// of the fresh claims in tx, commit, then ack.
//
// Claims must have valid IDs (see [inbox.ValidateID]). tx must hold the
// write lock from its start (BEGIN IMMEDIATE, as [Open] sets up), so no
// other transaction can claim between the INSERT and the commit.
func ClaimTx(ctx context.Context, tx *sql.Tx, scope string, claims []driver.Claim) ([]driver.ClaimResult, error) {
	res := make([]driver.ClaimResult, len(claims))
	if len(claims) == 0 {
		return res, nil
	}
	if err := inbox.ValidateID(scope); err != nil {
		return nil, fmt.Errorf("inbox: scope: %w", err)
	}
	// uniq lists the index of the first claim of each ID, in order.
	uniq := make([]int, 0, len(claims))
	first := make(map[string]int, len(claims))
	for i := range claims {
		c := &claims[i]
		if err := inbox.ValidateID(c.ID); err != nil {
			return nil, fmt.Errorf("inbox: claim %d: %w", i, err)
		}
		if j, dup := first[c.ID]; dup {
			res[i] = driver.ClaimResult{State: driver.ClaimDuplicate, InBatch: true, First: j}
			if !c.SameIntent(claims[j].Fingerprint[:], claims[j].Subject) {
				res[i].State = driver.ClaimConflict
			}
			continue
		}
		first[c.ID] = i
		uniq = append(uniq, i)
	}
	inserted := make(map[string]bool, len(uniq))
	var full *sql.Stmt
	args := make([]any, 0, 5*claimChunk)
	for len(uniq) > 0 {
		n := min(len(uniq), claimChunk)
		args = args[:0]
		for _, i := range uniq[:n] {
			c := &claims[i]
			args = append(args, scope, c.ID, c.Fingerprint[:], int64(c.StreamSeq), c.Subject)
		}
		q := `INSERT INTO inbox (scope, message_id, fingerprint, stream_seq, subject) VALUES ` + values(n, 5) +
			` ON CONFLICT (scope, message_id) DO NOTHING RETURNING message_id`
		var rows *sql.Rows
		var err error
		if n == claimChunk {
			if full == nil {
				if full, err = tx.PrepareContext(ctx, q); err != nil {
					return nil, fmt.Errorf("inbox: claim: %w", err)
				}
				defer full.Close()
			}
			rows, err = full.QueryContext(ctx, args...)
		} else {
			rows, err = tx.QueryContext(ctx, q, args...)
		}
		if err != nil {
			return nil, fmt.Errorf("inbox: claim: %w", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, fmt.Errorf("inbox: claim: %w", err)
			}
			inserted[id] = true
		}
		if err := rows.Err(); err != nil {
			rows.Close()
			return nil, fmt.Errorf("inbox: claim: %w", err)
		}
		rows.Close()
		for _, i := range uniq[:n] {
			if inserted[claims[i].ID] {
				res[i].State = driver.ClaimFresh
				continue
			}
			if err := readExisting(ctx, tx, scope, &claims[i], &res[i]); err != nil {
				return nil, err
			}
		}
		uniq = uniq[n:]
	}
	return res, nil
}

// readExisting fills r from the row that was already there for c.
func readExisting(ctx context.Context, tx *sql.Tx, scope string, c *driver.Claim, r *driver.ClaimResult) error {
	var fp []byte
	var subject, status, reason string
	var seq int64
	if err := tx.QueryRowContext(ctx, existingSQL, scope, c.ID).Scan(&fp, &subject, &status, &reason, &seq); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			// Not inserted yet not there: it cannot happen under the
			// unique key; refuse to guess rather than report a false
			// fresh claim.
			return fmt.Errorf("inbox: claim: row %q neither inserted nor found", c.ID)
		}
		return fmt.Errorf("inbox: claim: read existing: %w", err)
	}
	*r = driver.ClaimResult{State: driver.ClaimDuplicate, PriorStatus: driver.RowStatus(status), PriorReason: reason, PriorSeq: uint64(seq), PriorSubject: subject}
	if !c.SameIntent(fp, subject) {
		r.State = driver.ClaimConflict
	}
	return nil
}
