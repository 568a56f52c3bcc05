package inbox

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jetinbox/jetinbox/inbox/driver"
)

// sameClaim reports whether two claims of one ID are the same intent.
func sameClaim(a, b *driver.Claim) bool {
	return a.Fingerprint == b.Fingerprint && a.Subject == b.Subject
}

// claimEach claims one message at a time, each under a savepoint, so that a
// claim the database refuses (a data error the checks before the claim did
// not catch) rolls back alone: refused[i] is its permanent error, and the
// other claims stand. Copies of an ID earlier in the slice are resolved
// the way pginbox.ClaimTx does.
func (p *Processor[TX]) claimEach(ctx context.Context, tx TX, claims []driver.Claim) (res []driver.ClaimResult, refused []error, err error) {
	st := p.store
	res = make([]driver.ClaimResult, len(claims))
	refused = make([]error, len(claims))
	first := make(map[string]int, len(claims))
	for i := range claims {
		c := &claims[i]
		if j, dup := first[c.ID]; dup {
			res[i] = driver.ClaimResult{State: driver.ClaimDuplicate, InBatch: true, First: j}
			if !sameClaim(&claims[j], c) {
				res[i].State = driver.ClaimConflict
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
			if st.Classify(err) != driver.ErrorData {
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
func sortedUnique(claims []driver.Claim) []int {
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
