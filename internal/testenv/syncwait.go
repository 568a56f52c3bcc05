package testenv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// AbsentStandby is the synchronous_standby_names of [NewStandbyless]: a
// standby that never connects.
const AbsentStandby = "jetinbox_absent_standby"

// NewStandbyless starts a PostgreSQL cluster of its own for a test and
// stops it when the test ends. Once the test calls
// [Postgres.SetSynchronousStandby] with [AbsentStandby] (after it made
// its databases), every COMMIT of a transaction that wrote waits for a
// standby that never connects, until the backend is cancelled, and then
// returns success with PostgreSQL's warning that the transaction
// committed locally only, as a primary does while its synchronous standby
// is stalled. Sessions that set synchronous_commit=local (in their URL:
// "&synchronous_commit=local") commit without waiting: use one to set up
// and read back.
func NewStandbyless(t testing.TB) *Postgres {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := StartPostgres(ctx, PostgresOptions{})
	if err != nil {
		t.Fatalf("PostgreSQL is required for this test: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// SetSynchronousStandby sets the server's synchronous_standby_names
// (ALTER SYSTEM, reloaded) and returns once a new session sees it.
func (p *Postgres) SetSynchronousStandby(ctx context.Context, names string) error {
	c, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+pgx.Identifier{names}.Sanitize()); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	if _, err := c.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	for {
		c2, err := pgx.Connect(ctx, p.URL("postgres"))
		if err != nil {
			return fmt.Errorf("testenv: %w", err)
		}
		var now string
		err = c2.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&now)
		c2.Close(ctx)
		if err != nil {
			return fmt.Errorf("testenv: %w", err)
		}
		if now == names {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: synchronous_standby_names still %q: %w", now, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// CancelSyncRepWaits cancels (pg_cancel_backend), through c, a superuser
// connection, every other backend of its server that waits for its synchronous standby to
// confirm a commit, as an operator does whose commits hang on a dead
// standby, and returns how many it cancelled.
func CancelSyncRepWaits(ctx context.Context, c *pgx.Conn) (int, error) {
	var n int
	err := c.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity
WHERE wait_event = 'SyncRep' AND pid <> pg_backend_pid()`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("testenv: cancel waits for the synchronous standby: %w", err)
	}
	return n, nil
}

// SyncRepCanceller cancels the waits for the synchronous standby of one
// server, every interval, from a superuser connection of its own, until
// Stop.
type SyncRepCanceller struct {
	stop      context.CancelFunc
	done      chan struct{}
	mu        sync.Mutex
	cancelled int
	err       error
}

// StartSyncRepCanceller connects to superuserURL and cancels the waiting
// backends every interval (after they waited at least that long) until
// Stop.
func StartSyncRepCanceller(ctx context.Context, superuserURL string, interval time.Duration) (*SyncRepCanceller, error) {
	c, err := pgx.Connect(ctx, superuserURL)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	cctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s := &SyncRepCanceller{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer c.Close(context.Background())
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-cctx.Done():
				return
			case <-tick.C:
			}
			n, err := CancelSyncRepWaits(cctx, c)
			s.mu.Lock()
			s.cancelled += n
			if err != nil && cctx.Err() == nil && s.err == nil {
				s.err = err
			}
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return s, nil
}

// Cancelled returns how many waits were cancelled so far.
func (s *SyncRepCanceller) Cancelled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cancelled
}

// Stop stops cancelling and returns how many waits were cancelled and the
// first error.
func (s *SyncRepCanceller) Stop() (int, error) {
	s.stop()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cancelled, s.err
}
