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

// The store passes every case of the suite every delivery store passes,
// each under a test name of its own (docs cite them).
func TestOutcomes(t *testing.T)                 { run1(t, deliverytest.Outcomes) }
func TestRetentionEndsInReconcile(t *testing.T) { run1(t, deliverytest.RetentionEndsInReconcile) }
func TestRecordedOnlyAfterTheAnswer(t *testing.T) {
	run1(t, deliverytest.RecordedOnlyAfterTheAnswer)
}
func TestKilledDispatcherRowComesBackWithItsKey(t *testing.T) {
	run1(t, deliverytest.KilledDispatcherRowComesBackWithItsKey)
}
func TestLeasesAreExclusive(t *testing.T)   { run1(t, deliverytest.LeasesAreExclusive) }
func TestLeaseLost(t *testing.T)            { run1(t, deliverytest.LeaseLost) }
func TestAddBacklogAndRedrive(t *testing.T) { run1(t, deliverytest.AddBacklogAndRedrive) }

// run1 runs one case of the suite on a fresh database, beside the others.
func run1(t *testing.T, f func(*testing.T, deliverytest.Env)) {
	t.Parallel()
	f(t, newEnv(t))
}
