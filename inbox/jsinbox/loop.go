// The fetch loop: batches form from what has arrived, a slot per batch in
// flight; messages the consumer will not take now go back with a delay.

package jsinbox

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

type stopReason int

const (
	stopShutdown stopReason = iota
	stopCrash
	stopDBDown
	// stopResubscribe: the client ended the pull subscription on its own
	// (the server said the consumer was deleted, or refused a pull); the
	// consumer binds the durable again instead of waiting forever.
	stopResubscribe
)

// formBatches forms batches adaptively: it takes a free slot, waits for one
// message, then takes whatever else has already arrived, up to BatchSize.
func (c *Consumer) formBatches(ctx, work context.Context, msgs chan delivery, ended <-chan struct{}, slots chan struct{}, wg *sync.WaitGroup, onCrash func(error), crash chan struct{}) stopReason {
	for {
		if c.dbDown.Load() {
			return stopDBDown
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return stopShutdown
		case <-crash:
			return stopCrash
		}
		var batch []delivery
		fetchStart := time.Now()
		select {
		case m := <-msgs:
			// Sized to what has arrived: at low load a batch of one or
			// two would otherwise allocate room for BatchSize (288 KB
			// at 6,000), a GC cycle every few dozen batches.
			batch = append(make([]delivery, 0, min(1+len(msgs), c.cfg.BatchSize)), m)
		case <-ctx.Done():
			<-slots
			return stopShutdown
		case <-crash:
			<-slots
			return stopCrash
		case <-ended:
			<-slots
			return stopResubscribe
		}
	fill:
		for len(batch) < c.cfg.BatchSize {
			select {
			case m := <-msgs:
				batch = append(batch, m)
			default:
				break fill
			}
		}
		wg.Add(1)
		c.inFlight.Add(1)
		go func() {
			defer func() {
				var n int64
				for _, d := range batch {
					n += c.held(d.m)
				}
				c.budget.Release(n)
				c.inFlight.Add(-1)
				<-slots
				wg.Done()
			}()
			if c.crashed.Load() {
				return // a dead process acks nothing
			}
			if err := processDeliveries(work, batch, fetchStart); err != nil {
				onCrash(err)
			}
		}()
	}
}

// keepAlive sends InProgress for every message of a batch each AckWait/2,
// so the server does not redeliver a batch that is still working.
func (c *Consumer) keepAlive(batch []delivery, stop chan struct{}) {
	if c.cfg.KeepAlive < 0 {
		return
	}
	tick := time.NewTicker(c.cfg.KeepAlive)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			for _, d := range batch {
				_ = d.m.InProgress()
			}
		case <-stop:
			return
		}
	}
}

// handBack returns a message the consumer will not process now: a short
// jittered delay spreads the redeliveries. A message on its last delivery
// cannot come back, so it is processed now instead (and dead-lettered with
// the reason if that is the message's fault), unless the database is
// down: then it is let go, for the rescue. After a simulated crash nothing
// is done, as a dead process would do nothing.
func (c *Consumer) handBack(ctx context.Context, m jetstream.Msg) {
	if c.crashed.Load() {
		return
	}
	if md, err := m.Metadata(); err == nil && c.cfg.MaxDeliver > 0 && md.NumDelivered >= uint64(c.cfg.MaxDeliver) {
		if c.dbDown.Load() {
			c.leftForRescue.Add(1)
			return // let go: the rescue applies it (see lastTry)
		}
		_ = c.processBatch(ctx, []jetstream.Msg{m}, time.Now())
		return
	}
	_ = m.NakWithDelay(c.cfg.Nak.Delay(1))
}

// waitForDB pauses fetching until the processor's Check passes: the
// database answers, and takes batches as it is set up (migrated, writable,
// holding a transaction, with the grants), so that a read-only node or a
// missing migration keeps the consumer paused instead of letting it
// fetch, fail and use up deliveries. The waits go on growing across
// pauses with no committed batch between them.
func (c *Consumer) waitForDB(ctx context.Context) error {
	if committed := c.batchOK.Swap(false); committed || c.pauses == nil {
		c.pauses = c.cfg.DBWait.NewBackOff()
	}
	bo := c.pauses
	logged := false
	for {
		d := bo.NextBackOff()
		if d < 0 {
			d = c.cfg.DBWait.WithDefaults().Cap
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := check(cctx, c.proc)
		cancel()
		if err == nil {
			c.dbDown.Store(false)
			c.cfg.Logger.Info("jsinbox: the database takes batches again; consuming")
			return nil
		}
		if !logged {
			logged = true
			c.cfg.Logger.Warn("jsinbox: the database cannot take batches; fetching paused until it can", "err", err)
		}
	}
}
