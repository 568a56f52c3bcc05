// One batcher for several consumers: a shard's partition durables feed
// one stream of batches, so that its transactions are as large as one
// durable's under the same load.

package jsinbox

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// delivery is a message as a consumer's pull subscription handed it over:
// the consumer whose durable delivered it settles it.
type delivery struct {
	m  jetstream.Msg
	c  *Consumer
	at time.Time // when the client handed it to the consumer
}

// Batcher forms the batches of several consumers together: each consumer
// given it in [ConsumerConfig.Batcher] still binds and pulls its own
// durable, takes its own byte budget and settles its own messages (acks,
// naks, dead letters, its rescue), but its messages join batches formed
// from all of them, up to the batcher's size, with the batcher's slots in
// flight. The consumers must share one processor: a batch runs through
// it in one transaction.
//
// Run it before the consumers and stop it after they returned: a
// consumer's Run returns only once every message it handed over is
// settled or handed back.
type Batcher struct {
	size  int
	in    chan delivery
	slots chan struct{}
	wg    sync.WaitGroup
}

// NewBatcher returns a Batcher whose batches take at most batchSize
// messages (default 6000), inFlight of them at once (default 2).
func NewBatcher(batchSize, inFlight int) *Batcher {
	if batchSize <= 0 {
		batchSize = 6000
	}
	if inFlight <= 0 {
		inFlight = 2
	}
	return &Batcher{size: batchSize, in: make(chan delivery, batchSize), slots: make(chan struct{}, inFlight)}
}

// Run forms batches until ctx ends, waits for the batches in flight, and
// hands back what it held but had not started. The batches it starts
// finish even when ctx ends.
func (b *Batcher) Run(ctx context.Context) {
	work := context.WithoutCancel(ctx)
	defer func() {
		b.wg.Wait()
		for {
			select {
			case d := <-b.in:
				d.c.budget.Release(d.c.held(d.m))
				d.c.handBack(work, d.m)
				d.c.pending.Add(-1)
			default:
				return
			}
		}
	}()
	for {
		select {
		case b.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		var batch []delivery
		fetchStart := time.Now()
		select {
		case d := <-b.in:
			// Sized to what has arrived (see formBatches).
			batch = append(make([]delivery, 0, min(1+len(b.in), b.size)), d)
		case <-ctx.Done():
			<-b.slots
			return
		}
	fill:
		for len(batch) < b.size {
			select {
			case d := <-b.in:
				batch = append(batch, d)
			default:
				break fill
			}
		}
		b.wg.Add(1)
		go func() {
			defer func() {
				for _, d := range batch {
					d.c.budget.Release(d.c.held(d.m))
					d.c.pending.Add(-1)
				}
				<-b.slots
				b.wg.Done()
			}()
			// A consumer that crashed acks nothing: its messages stay
			// unsettled, as a dead process leaves them.
			live := batch[:0:0]
			for _, d := range batch {
				if !d.c.crashed.Load() {
					live = append(live, d)
				}
			}
			if len(live) == 0 {
				return
			}
			live[0].c.inFlight.Add(1)
			defer live[0].c.inFlight.Add(-1)
			if err := processDeliveries(work, live, fetchStart); err != nil {
				for _, d := range live {
					d.c.onCrash(err)
				}
			}
		}()
	}
}

// waitShared is formBatches for a consumer whose batches a [Batcher]
// forms: it waits for the reason to stop pulling.
func (c *Consumer) waitShared(ctx context.Context, ended <-chan struct{}, crash chan struct{}) stopReason {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if c.dbDown.Load() {
			return stopDBDown
		}
		select {
		case <-ctx.Done():
			return stopShutdown
		case <-crash:
			return stopCrash
		case <-ended:
			return stopResubscribe
		case <-tick.C:
		}
	}
}
