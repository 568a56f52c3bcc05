package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Row is a pending outbox row as a relay publishes it.
type Row struct {
	ID, Subject string
	Payload     []byte
}

// Source is the database a [Relay] takes pending rows from. [Postgres] is
// PostgreSQL's; [NewRelay] takes any.
type Source interface {
	// Take takes up to n pending rows, oldest first, that no other relay
	// holds, and holds them until Finish or Abandon.
	Take(ctx context.Context, n int) (Taken, error)
}

// Taken is a batch of rows a relay holds.
type Taken interface {
	// Rows are the rows taken; none means there was nothing to send.
	Rows() []Row
	// Finish marks the rows of sent as sent and those of failed as
	// refused for good (with the reason), durably, in one step, and lets
	// go of the batch. It returns how long each sent row waited since it
	// was added. A source whose hold can lapse (a lease) marks only the
	// rows it still holds; if another relay has taken some over, Finish
	// commits the others and returns a *[NotHeldError] naming them.
	Finish(ctx context.Context, sent []string, failed map[string]string) ([]time.Duration, error)
	// Abandon lets go of the rows without marking anything: they are
	// pending again, except those another relay has taken over since,
	// which stay that relay's. After Finish it does nothing.
	Abandon(ctx context.Context)
}

// NotHeldError is returned by a [Taken]'s Finish that committed the marks of
// the rows it still held, and left alone the rows another relay took over
// after this relay's hold lapsed (the SQLite source's lease ran out): that
// relay publishes them again (duplicates the stream drops inside its
// window) and marks them.
type NotHeldError struct {
	// IDs are the rows of Finish's sent and failed that were not marked.
	IDs []string
}

// Error says how many rows were taken over.
func (e *NotHeldError) Error() string {
	if len(e.IDs) == 0 {
		return "no rows were taken over by another relay"
	}
	return fmt.Sprintf("%d rows were taken over by another relay before they were marked (first %s); that relay sends and marks them", len(e.IDs), e.IDs[0])
}

// Listener is implemented by a [Source] that can wake a relay when rows
// are added.
type Listener interface {
	Listen(ctx context.Context) (Waiter, error)
}

// Waiter waits for new rows.
type Waiter interface {
	// Wait returns nil when rows were added or d has passed, and an error
	// when the waiter broke (the relay then polls, and listens again
	// later).
	Wait(ctx context.Context, d time.Duration) error
	Close()
}

// Postgres returns the [Source] of an outbox in PostgreSQL: a batch is
// locked with SELECT … FOR UPDATE SKIP LOCKED in a transaction that stays
// open until it is marked, and the locks of a relay that dies end with its
// connection. It is a [Listener] (LISTEN on [Channel]).
func Postgres(pool *pgxpool.Pool) Source { return pgSource{pool} }

type pgSource struct{ pool *pgxpool.Pool }

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

func (s pgSource) Take(ctx context.Context, n int) (Taken, error) {
	tx, err := s.pool.Begin(ctx)
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
		var r Row
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
	rows []Row
}

func (t *pgTaken) Rows() []Row { return t.rows }

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
	if err := t.tx.Commit(cctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return lags, nil
}

// Listen opens a connection of its own (taken out of the pool, so that no
// other user gets a connection that listens) and LISTENs on Channel.
func (s pgSource) Listen(ctx context.Context) (Waiter, error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return pgWaiter{conn}, nil
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
