package inbox

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
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

// claimEach claims one message at a time, each under a savepoint, so that a
// claim the database refuses (a data error the checks before the claim did
// not catch) rolls back alone: refused[i] is its permanent error, and the
// other claims stand. Copies of an ID earlier in the slice are resolved
// the way pginbox.ClaimTx does.
func (p *Processor[TX]) claimEach(ctx context.Context, tx TX, claims []Claim) (res []ClaimResult, refused []error, err error) {
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
