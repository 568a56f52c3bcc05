package pginbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
)

// TestReadOnlyIsNotARejection: during a failover a consumer may still be
// connected to the demoted primary, now a standby, where every write fails
// with read_only_sql_transaction (25006). That says where the connection
// points, not what the message holds: even on its final delivery the
// message is retried, never rejected.
func TestReadOnlyIsNotARejection(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	ledger := effects.NewLedger()
	// The effect's first write meets the read-only node, as it would on a
	// standby: the server raises the very SQLSTATE a hot standby raises.
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if strings.HasPrefix(m.ID, "demoted") {
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction' USING ERRCODE = 'read_only_sql_transaction'; END $$`)
			return err
		}
		errs := make([]error, 1)
		if err := ledger.Handle(ctx, tx, []inbox.Message{m}, errs); err != nil {
			return err
		}
		return errs[0]
	})
	p, err := inbox.NewProcessor(pginbox.New(pool), h, inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	final := intent("demoted-final", 1, 5)
	final.Final, final.Deliveries = true, 20
	out, err := p.Process(ctx, []inbox.Message{intent("demoted", 1, 5), final, intent("fine", 1, 5)})
	if err == nil {
		for i, o := range out {
			if o.Status == inbox.StatusRejected {
				t.Errorf("message %d rejected (%v: %s): a read-only node is not the message's fault", i, o.Cause, o.Reason)
			}
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE status <> 'applied'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d inbox rows stored as not applied after a read-only error", n)
	}
}

// TestReadOnlyDatabaseRetriesTheBatch: the whole database read-only, as a
// standby is: every claim fails with 25006, and no message of the batch is
// rejected, on its final delivery either.
func TestReadOnlyDatabaseRetriesTheBatch(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	p := newLedgerProcessor(t, pool)
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	pool.Reset() // new connections pick up the setting
	final := intent("ro-final", 1, 5)
	final.Final, final.Deliveries = true, 20
	out, err := p.Process(ctx, []inbox.Message{intent("ro", 1, 5), final})
	if err == nil {
		for i, o := range out {
			if o.Status != inbox.StatusRetry {
				t.Errorf("message %d: %v (%v: %s), want retry", i, o.Status, o.Cause, o.Reason)
			}
		}
	}
}
