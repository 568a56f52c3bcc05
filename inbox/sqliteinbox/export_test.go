package sqliteinbox

import (
	"context"
	"database/sql"

	"github.com/jetinbox/jetinbox/inbox/driver"
)

// PlantBlindClaim gives s a broken claim, which skips IDs already there
// yet reports every claim fresh: the guarantee tests must catch it.
func PlantBlindClaim(s *Store) { s.claim = claimBlind }

func claimBlind(ctx context.Context, tx *sql.Tx, scope string, claims []driver.Claim) ([]driver.ClaimResult, error) {
	res := make([]driver.ClaimResult, len(claims))
	for i, c := range claims {
		if _, err := tx.ExecContext(ctx, `INSERT INTO inbox (scope, message_id, fingerprint) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`,
			scope, c.ID, c.Fingerprint[:]); err != nil {
			return nil, err
		}
		res[i].State = driver.ClaimFresh
	}
	return res, nil
}
