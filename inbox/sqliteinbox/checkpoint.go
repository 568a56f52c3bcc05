package sqliteinbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strconv"
	"sync"
	"time"
)

// CheckpointInterval is how often the database [Open] opened copies what
// its write-ahead log holds back into the database file, on a connection
// of its own.
const CheckpointInterval = 100 * time.Millisecond

// walSafetyNet is the writer connection's wal_autocheckpoint, in pages:
// the log the writer itself copies back at a COMMIT only if the
// background checkpoints have fallen that far behind (40 MiB at 4 KiB
// pages). SQLite's default is 1000.
const walSafetyNet = 10000

// Checkpoints run beside the writer, not in its COMMIT. With SQLite's
// default, the COMMIT that grows the log past 1000 pages copies them into
// the database file and fsyncs it before it returns: one batch in a few
// hundred waited milliseconds for its ack, and every batch queued behind
// the one writer connection waited with it. A PASSIVE checkpoint on a
// second connection does the same copy without taking the write lock, so
// the writer goes on appending to the log meanwhile. What is durable does
// not change: a COMMIT still returns only once its log frames are synced
// (synchronous=FULL), and a crash in the middle of a checkpoint is
// recovered from the log.

// checkpointConnector is the writer pool's connector: closing the pool
// (database/sql closes a connector that is an io.Closer) stops the
// background checkpoints and closes their connection.
type checkpointConnector struct {
	driver.Connector
	ckpt *sql.DB
	stop context.CancelFunc
	done chan struct{}
	once sync.Once
	err  error
}

// openWithCheckpoints opens the writer pool on dsn with its log copied
// back by a background checkpointer on a connection of its own.
func openWithCheckpoints(newConnector func(string) (driver.Connector, error), dsn string) (*sql.DB, error) {
	w, err := newConnector(dsn + "&_pragma=wal_autocheckpoint(" + strconv.Itoa(walSafetyNet) + ")")
	if err != nil {
		return nil, err
	}
	// A PASSIVE checkpoint waits for no lock (the busy timeout does not
	// apply to it); one that finds another checkpoint running is tried
	// again at the next tick.
	cc, err := newConnector(dsn)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &checkpointConnector{Connector: w, ckpt: sql.OpenDB(cc), stop: stop, done: make(chan struct{})}
	c.ckpt.SetMaxOpenConns(1)
	c.ckpt.SetMaxIdleConns(1)
	c.ckpt.SetConnMaxLifetime(0)
	c.ckpt.SetConnMaxIdleTime(0)
	go c.run(ctx, CheckpointInterval)
	return sql.OpenDB(c), nil
}

// run checkpoints every interval until Close. A failed checkpoint is left
// to the next tick; the writer's own wal_autocheckpoint is the net under
// it.
func (c *checkpointConnector) run(ctx context.Context, interval time.Duration) {
	defer close(c.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	var busy, logFrames, copied int
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_ = c.ckpt.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logFrames, &copied)
	}
}

// Close stops the checkpoints and closes their connection; database/sql
// calls it when the writer pool is closed.
func (c *checkpointConnector) Close() error {
	c.once.Do(func() {
		c.stop()
		<-c.done
		c.err = c.ckpt.Close()
	})
	return c.err
}
