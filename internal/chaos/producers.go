// The producer strategies: publish once, retry with a fresh ID, retry with
// the stable ID, or publish atomic batches through jsinbox's Publisher.

package chaos

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/jitter"
)

// produce publishes intents by the producer strategy, under dropped
// publishes and lost PubAcks. Publishes are synchronous, but for the batch
// strategy: the point is the protocol, not speed.
func (r *run) produce(ctx context.Context, strategy string, intents []inbox.Intent, each func(i int)) error {
	if strategy == "stable-id-batch" {
		return r.produceBatches(ctx, intents, each)
	}
	for i, in := range intents {
		each(i)
		id := in.ID
		for attempt := 0; attempt < 20; attempt++ {
			if strategy == "fresh-id" && attempt > 0 {
				id = in.ID + "~r" + strconv.Itoa(attempt) // a new ID per retry: what a client without a key does
			}
			ok := false
			if r.roll(r.o.DropPublish) {
				r.fault("dropped publishes")
			} else {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := r.js.PublishMsg(pctx, &nats.Msg{Subject: in.Subject, Data: in.Payload, Header: nats.Header{jetstream.MsgIDHeader: []string{id}}})
				cancel()
				if err == nil {
					if r.roll(r.o.LosePubAck) {
						r.fault("lost PubAcks")
					} else {
						ok = true
					}
				}
			}
			if ok || strategy == "once" {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.diceMu.Lock()
			d := time.Duration(r.dice.Int64N(int64(20 * time.Millisecond)))
			r.diceMu.Unlock()
			time.Sleep(d) // jittered, short: this is a test
		}
	}
	return nil
}

// produceBatches publishes through jsinbox's Publisher in atomic batches,
// whose messages the stream stores with their Nats-Batch-* headers. Lost
// PubAcks come from its failpoint: the whole batch is published again, one
// intent at a time, with the same IDs.
func (r *run) produceBatches(ctx context.Context, intents []inbox.Intent, each func(i int)) error {
	fp := failpoint.New()
	if r.o.LosePubAck > 0 {
		fp.EnableEvery(failpoint.LosePubAck, max(2, int(1/r.o.LosePubAck)), -1)
	}
	p, err := jsinbox.NewPublisher(r.js, jsinbox.PublisherConfig{Batch: 50, Linger: 5 * time.Millisecond, AckTimeout: 2 * time.Second,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 5 * time.Millisecond, Cap: 100 * time.Millisecond, MaxAttempts: 20}})
	if err != nil {
		return err
	}
	defer p.Close()
	fp.Attach(p)
	for i, in := range intents {
		each(i)
		if err := p.PublishAsync(ctx, in); err != nil {
			return err
		}
	}
	if err := p.Flush(ctx); err != nil {
		return err
	}
	r.faults["lost PubAcks"].Add(int64(fp.Hits(failpoint.LosePubAck)))
	if f := p.Failures(); len(f) > 0 {
		return fmt.Errorf("%d intents not published, first %s: %w", len(f), f[0].ID, f[0].Err)
	}
	return nil
}
