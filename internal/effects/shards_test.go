package effects

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestBalancesSumOverShards: an account's balance is the sum of its
// partial balances, and an account missing from a shard is reported.
func TestBalancesSumOverShards(t *testing.T) {
	ctx := context.Background()
	var shards []Querier
	var pools []*pgxpool.Pool
	for range 2 {
		pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if _, err := Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		if err := SeedAccounts(ctx, pool, 2); err != nil {
			t.Fatal(err)
		}
		pools = append(pools, pool)
		shards = append(shards, pool)
	}
	for i, p := range pools {
		if _, err := p.Exec(ctx, `UPDATE accounts SET balance = $1 WHERE id = 1`, 10*(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := Balances(ctx, shards...)
	if err != nil || b[1] != 30 || b[2] != 0 {
		t.Fatalf("balances %v (%v), want account 1 at 10 + 20", b, err)
	}
	if _, err := pools[1].Exec(ctx, `DELETE FROM accounts WHERE id = 2`); err != nil {
		t.Fatal(err)
	}
	if _, err := Balances(ctx, shards...); err == nil || !strings.Contains(err.Error(), "account 2 is open in 1 of 2 shards") {
		t.Fatalf("an account missing from a shard: %v", err)
	}
}
