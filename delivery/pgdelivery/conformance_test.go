package pgdelivery_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/internal/deliverytest"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// newEnv is a fresh, migrated database; Open gives another pool on it, as
// another dispatcher process has.
func newEnv(t *testing.T) deliverytest.Env {
	url := testenv.NewDatabase(t)
	open := func(t *testing.T) *pgxpool.Pool {
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	pool := open(t)
	st := pgdelivery.New(pool)
	if _, err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return deliverytest.Env{
		Store: st,
		Open:  func(t *testing.T) deliverytest.Store { return pgdelivery.New(open(t)) },
		Add: func(ctx context.Context, in ...delivery.Intent) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
			if err := pgdelivery.Add(ctx, tx, in...); err != nil {
				return err
			}
			return tx.Commit(ctx)
		},
	}
}

// The store passes the suite every delivery store passes: outcomes,
// retention, leases, a killed dispatcher, dead letters and redrive.
func TestConformance(t *testing.T) { deliverytest.Run(t, newEnv) }
