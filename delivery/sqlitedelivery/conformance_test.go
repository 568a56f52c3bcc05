package sqlitedelivery_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/internal/deliverytest"
	"github.com/jetinbox/jetinbox/delivery/sqlitedelivery"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
)

// open opens the file as a consumer or a dispatcher process would, until
// the test ends.
func open(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sqliteinbox.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// newEnv is a fresh, migrated SQLite file; Open gives another handle on
// it (a connection of its own, as another process has).
func newEnv(t *testing.T) deliverytest.Env {
	path := filepath.Join(t.TempDir(), "deliveries.db")
	db := open(t, path)
	st := sqlitedelivery.New(db)
	if _, err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return deliverytest.Env{
		Store: st,
		Open:  func(t *testing.T) deliverytest.Store { return sqlitedelivery.New(open(t, path)) },
		Add: func(ctx context.Context, in ...delivery.Intent) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
			if err := sqlitedelivery.Add(ctx, tx, in...); err != nil {
				return err
			}
			return tx.Commit()
		},
	}
}

// The store passes the suite every delivery store passes.
func TestConformance(t *testing.T) { deliverytest.Run(t, newEnv) }
