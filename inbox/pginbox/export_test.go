package pginbox

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox/driver"
)

// DisableCopyClaim makes s claim every batch with ClaimTx; tests compare
// both paths.
func DisableCopyClaim(s *Store) { s.noCopy = true }

func claimBlind(ctx context.Context, tx pgx.Tx, scope string, claims []driver.Claim, order []int) error {
	ids := make([]string, len(order))
	fps := make([][]byte, len(order))
	for k, i := range order {
		ids[k], fps[k] = claims[i].ID, claims[i].Fingerprint[:]
	}
	_, err := tx.Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint)
SELECT $1, * FROM unnest($2::text[], $3::bytea[]) ON CONFLICT DO NOTHING`, scope, ids, fps)
	return err
}

// CopyClaimThreshold is the smallest batch claimed with COPY.
const CopyClaimThreshold = copyClaimThreshold

// PlantBlindClaims gives the PostgreSQL store s broken claims, on both
// paths, which skip IDs already there yet report every claim fresh.
func PlantBlindClaims(st driver.Store[pgx.Tx]) {
	s := st.(*Store)
	s.claimCopy = claimBlind
	s.claim = func(ctx context.Context, tx pgx.Tx, scope string, claims []driver.Claim) ([]driver.ClaimResult, error) {
		order := make([]int, len(claims))
		for i := range order {
			order[i] = i
		}
		if err := claimBlind(ctx, tx, scope, claims, order); err != nil {
			return nil, err
		}
		res := make([]driver.ClaimResult, len(claims))
		for i := range res {
			res[i].State = driver.ClaimFresh
		}
		return res, nil
	}
}
