package effects

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Querier runs a query: *pgxpool.Pool, *pgx.Conn, pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Balances returns the balance of every account on a sharded ledger: each
// shard's database keeps a partial balance per account (what the messages
// of its partitions credited), and the balance is their sum. A credit
// then commits in the one shard that applies its message, with its inbox
// row, never across two databases; an account is opened in every shard.
// Missing accounts in some shard are reported: their credits there were
// rejected as unknown.
func Balances(ctx context.Context, shards ...Querier) (map[int64]int64, error) {
	sum := map[int64]int64{}
	seen := map[int64]int{}
	for i, db := range shards {
		rows, err := db.Query(ctx, `SELECT id, balance FROM accounts`)
		if err != nil {
			return nil, fmt.Errorf("effects: balances of shard %d: %w", i, err)
		}
		var id, bal int64
		_, err = pgx.ForEachRow(rows, []any{&id, &bal}, func() error {
			sum[id] += bal
			seen[id]++
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("effects: balances of shard %d: %w", i, err)
		}
	}
	for id, n := range seen {
		if n != len(shards) {
			return sum, fmt.Errorf("effects: account %d is open in %d of %d shards: open accounts in every shard", id, n, len(shards))
		}
	}
	return sum, nil
}
