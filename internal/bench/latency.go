// Publish-to-commit latency at a steady low rate.

package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
)

// latencyRun is one latency phase: what was offered, what the publisher
// achieved, and every message's publish-to-commit time.
type latencyRun struct {
	offered  int     // msg/s asked for
	achieved float64 // msg/s the publisher kept up
	lat      []time.Duration
	// relayLat: with follow-ups, each follow-up's emit-to-publish time
	// (its transaction's start to being marked sent).
	relayLat []time.Duration
	// stages: each message's publish-to-ack split by stage.
	stages []stageTimes
	// runtime: GC pauses and goroutine scheduling delays in the phase.
	runtime runtimeStats
}

// latencyPhase offers a steady rate for o.Latency and measures
// publish-to-commit (stream timestamp to the batch's commit) of every
// message. name keeps the phase's database, durable and IDs apart.
func latencyPhase(ctx context.Context, js jetstream.JetStream, dbs databases, o Options, rate int, name string) (*latencyRun, error) {
	pool, err := dbs.create(ctx, name, o.Accounts)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	s, err := js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		return nil, err
	}
	si, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	c, err := js.CreateOrUpdateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq: si.State.LastSeq + 1, AckWait: time.Minute, MaxAckPending: 50_000, MaxDeliver: 20,
	})
	if err != nil {
		return nil, err
	}
	total := max(1, int(float64(rate)*o.Latency.Seconds()))
	intents := pipeline.Generate(pipeline.Load{Count: total, Accounts: o.Accounts, HotAccount: o.Hot, Prefix: name, Seed: 9})
	ids := make([]string, len(intents))
	for i := range intents {
		ids[i] = intents[i].ID
	}
	obs := newStageObserver(&countObserver{done: make(chan struct{}), n: int64(total), latency: true}, ids)
	run := &latencyRun{offered: rate}
	var lags lagCollector
	if o.followUps {
		relay, err := newRelay(pool, js, o, &lags)
		if err != nil {
			return nil, err
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- relay.Run(rctx) }()
		defer func() {
			stop()
			<-done
		}()
	}
	err = consumeWith(ctx, js, c, pool, o, obs, func() error {
		// One by one, pipelined: without sync_interval always that keeps up
		// with a higher rate than group commit, so the offered rate is met.
		pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{Batch: 1, MaxInFlight: 8192})
		if err != nil {
			return err
		}
		defer pub.Close()
		// Paced by the clock, not by a ticker per message: a ticker cannot
		// fire every 30 µs, and one that falls behind would lower the rate.
		// Whatever is due is published at once, so a late wake-up catches up.
		rt := startRuntimeWindow()
		defer func() { run.runtime = rt.end() }()
		start := time.Now()
		for sent := 0; sent < total; {
			due := min(total, int(time.Since(start).Seconds()*float64(rate))+1)
			for ; sent < due; sent++ {
				obs.published(sent)
				if err := pub.PublishAsync(ctx, intents[sent]); err != nil {
					return err
				}
			}
			if next := start.Add(time.Duration(float64(sent) / float64(rate) * float64(time.Second))); sent < total {
				time.Sleep(time.Until(next))
			}
		}
		run.achieved = float64(total) / time.Since(start).Seconds()
		select {
		case <-obs.done:
			return nil
		case <-time.After(time.Minute):
			return errors.New("latency phase: not every message committed within a minute")
		}
	})
	if err != nil {
		return nil, err
	}
	var want int64
	for _, in := range intents {
		p, _ := effects.ParseIntent(in.Payload)
		want += p.Amount
	}
	if err := checkLedger(ctx, pool, len(intents), want); err != nil {
		return nil, err
	}
	run.lat = obs.lat
	run.stages = obs.all()
	if o.followUps {
		for deadline := time.Now().Add(time.Minute); len(lags.all()) < total; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("latency phase: the relay sent %d of %d follow-ups within a minute", len(lags.all()), total)
			}
		}
		run.relayLat = lags.all()
	}
	return run, nil
}

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))].Round(100 * time.Microsecond)
}
