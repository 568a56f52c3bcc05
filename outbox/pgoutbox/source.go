package pgoutbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/internal/pgwatch"
	"github.com/jetinbox/jetinbox/outbox"
)

// pendingSQL locks the oldest pending rows that no other relay holds.
const pendingSQL = `SELECT id, subject, payload FROM outbox
WHERE sent_at IS NULL AND failed IS NULL
ORDER BY seq
LIMIT $1
FOR UPDATE SKIP LOCKED`

// markSQL marks rows sent and returns how long each waited.
const markSQL = `UPDATE outbox SET sent_at = clock_timestamp()
WHERE id = ANY($1)
RETURNING extract(epoch FROM sent_at - created_at)::float8`

// failSQL marks rows refused for good.
const failSQL = `UPDATE outbox SET failed = f.reason FROM unnest($1::text[], $2::text[]) AS f(id, reason) WHERE outbox.id = f.id`

// commitTimeout bounds the COMMIT of a batch's marks, which runs under a
// context that cannot be cancelled.
const commitTimeout = 30 * time.Second

// Take locks up to n pending rows, oldest first, that no other relay has
// locked, in a transaction that the returned batch's Finish commits (or
// Abandon rolls back). It is [outbox.Source]'s method.
func (s *Store) Take(ctx context.Context, n int) (outbox.Taken, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, pendingSQL, n)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	t := &pgTaken{tx: tx}
	for rows.Next() {
		var r outbox.Row
		if err := rows.Scan(&r.ID, &r.Subject, &r.Payload); err != nil {
			rows.Close()
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, err
		}
		t.rows = append(t.rows, r)
	}
	if err := rows.Err(); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return t, nil
}

type pgTaken struct {
	tx   pgx.Tx
	rows []outbox.Row
}

func (t *pgTaken) Rows() []outbox.Row { return t.rows }

func (t *pgTaken) Abandon(ctx context.Context) { _ = t.tx.Rollback(ctx) }

func (t *pgTaken) Finish(ctx context.Context, sent []string, failed map[string]string) ([]time.Duration, error) {
	var lags []time.Duration
	if len(sent) > 0 {
		rows, err := t.tx.Query(ctx, markSQL, sent)
		if err != nil {
			return nil, fmt.Errorf("mark sent: %w", err)
		}
		secs, err := pgx.CollectRows(rows, pgx.RowTo[float64])
		if err != nil {
			return nil, fmt.Errorf("mark sent: %w", err)
		}
		lags = make([]time.Duration, len(secs))
		for i, s := range secs {
			lags[i] = time.Duration(s * float64(time.Second))
		}
	}
	if len(failed) > 0 {
		ids, reasons := make([]string, 0, len(failed)), make([]string, 0, len(failed))
		for id, why := range failed {
			ids, reasons = append(ids, id), append(reasons, why)
		}
		if _, err := t.tx.Exec(ctx, failSQL, ids, reasons); err != nil {
			return nil, fmt.Errorf("mark failed: %w", err)
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	// A commit the synchronous standby never confirmed (its wait was
	// cancelled) is not known to have marked anything: a failover may
	// bring the rows back as pending.
	if err := pgwatch.Commit(cctx, t.tx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return lags, nil
}

// Listen opens a connection of its own and LISTENs on [outbox.Channel]: one
// taken out of the pool (so that no other user gets a connection that
// listens), of [Store.WithListen]'s pool if set, else of the store's; on a
// *pgx.Conn, a second connection with its configuration. It is
// [outbox.Listener]'s method.
func (s *Store) Listen(ctx context.Context) (outbox.Waiter, error) {
	conn, err := s.listenConn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+outbox.Channel); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return pgWaiter{conn}, nil
}

func (s *Store) listenConn(ctx context.Context) (*pgx.Conn, error) {
	pool := s.listen
	if pool == nil {
		switch db := s.db.(type) {
		case *pgxpool.Pool:
			pool = db
		case interface{ Config() *pgx.ConnConfig }:
			return pgx.ConnectConfig(ctx, db.Config().Copy())
		default:
			return nil, fmt.Errorf("outbox: listen: %T is neither a *pgxpool.Pool nor a *pgx.Conn; use Store.WithListen, or RelayConfig.NoListen", s.db)
		}
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return pc.Hijack(), nil
}

type pgWaiter struct{ conn *pgx.Conn }

// Wait returns when a notification arrives, d has passed (nil either way),
// or the connection failed (its error).
func (w pgWaiter) Wait(ctx context.Context, d time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := w.conn.WaitForNotification(wctx)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		// The poll's time is up. A wait that a timeout interrupted
		// leaves the connection usable unless the interruption broke it.
		if w.conn.IsClosed() {
			return err
		}
		return nil
	}
	return err
}

func (w pgWaiter) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.conn.Close(ctx)
}
