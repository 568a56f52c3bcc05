package cli

import (
	"context"
	"time"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/delivery/sqlitedelivery"
	"github.com/jetinbox/jetinbox/inbox"
)

// DeliveryStore is what the tools do with either backend's delivery store
// (*pgdelivery.Store, *sqlitedelivery.Store): dispatch from it, migrate and
// check it, list and redrive its dead letters, count its backlog.
type DeliveryStore interface {
	delivery.Store
	Migrate(ctx context.Context) (int, error)
	MigrationSQL() string
	MigrationStatus(ctx context.Context) ([]inbox.MigrationState, error)
	CheckSchema(ctx context.Context) error
	List(ctx context.Context, state delivery.State, endpoint string, limit int) ([]delivery.Row, error)
	Redrive(ctx context.Context, endpoint string, ids []int64) (int64, error)
	Backlog(ctx context.Context) (int64, time.Duration, error)
}

var (
	_ DeliveryStore = (*pgdelivery.Store)(nil)
	_ DeliveryStore = (*sqlitedelivery.Store)(nil)
)

// DeliveryStore returns the delivery store in the same database: the
// deliveries table beside the inbox, in PostgreSQL or in the SQLite file.
func (s *Store) DeliveryStore() DeliveryStore {
	if s.SQLite != nil {
		return sqlitedelivery.New(s.SQLite)
	}
	return pgdelivery.New(s.PG)
}
