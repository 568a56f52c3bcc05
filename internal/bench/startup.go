// Time to first commit of a worker that starts cold.

package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/pipeline"
)

// startupRuns is how many cold starts the start-up phase times.
const startupRuns = 5

// startupPhase times, startupRuns times, a consumer that starts as a
// restarted or autoscaled worker does: no open database connection, a
// message waiting in the stream. The time is from Consumer.Run to the
// commit of that message's batch: binding the durable, connecting and
// preparing statements, the first pull, the batch.
func startupPhase(ctx context.Context, js jetstream.JetStream, dbs databases, o Options) ([]time.Duration, error) {
	pool, err := dbs.create(ctx, "startup", o.Accounts)
	if err != nil {
		return nil, err
	}
	defer func() { pool.Close() }()
	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	var out []time.Duration
	for i := range startupRuns {
		s, err := js.Stream(ctx, jsinbox.DefaultStream)
		if err != nil {
			return nil, err
		}
		si, err := s.Info(ctx)
		if err != nil {
			return nil, err
		}
		in := pipeline.Generate(pipeline.Load{Count: 1, Accounts: o.Accounts, Prefix: fmt.Sprintf("start%d-", i), Seed: uint64(i)})
		if err := pub.PublishAsync(ctx, in[0]); err != nil {
			return nil, err
		}
		if err := pub.Flush(ctx); err != nil {
			return nil, err
		}
		durable := fmt.Sprintf("startup_%d", i)
		// Cold: every connection closed.
		if pool.PG != nil {
			pool.PG.Reset()
		} else {
			pool.Close()
			if pool, err = cli.OpenStore(ctx, dbs.url("startup"), 0, slog.New(slog.DiscardHandler)); err != nil {
				return nil, err
			}
		}
		proc, err := pool.LedgerProcessor(inbox.Config{Scope: "ledger"})
		if err != nil {
			return nil, err
		}
		obs := &countObserver{done: make(chan struct{}), n: 1}
		c, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{
			Durable: durable, BatchSize: o.Batch, InFlight: o.InFlight, AckWait: time.Minute, MaxAckPending: 50_000, Observer: obs, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: si.State.LastSeq + 1,
		})
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- c.Run(rctx) }()
		select {
		case <-obs.done:
		case err := <-done:
			cancel()
			return nil, fmt.Errorf("start-up phase: consumer stopped: %v", err)
		case <-time.After(30 * time.Second):
			cancel()
			<-done
			return nil, errors.New("start-up phase: no commit within 30 s")
		}
		out = append(out, obs.first.Load().Sub(start))
		cancel()
		if err := <-done; err != nil {
			return nil, err
		}
		if err := js.DeleteConsumer(ctx, jsinbox.DefaultStream, durable); err != nil {
			return nil, err
		}
	}
	return out, nil
}
