// Publish-to-commit latency at a steady low rate.

package bench

import (
	"context"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/effects"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// latencyPhase offers a steady low rate and measures publish-to-commit.
func latencyPhase(ctx context.Context, js jetstream.JetStream, pg *testenv.Postgres, o Options) ([]time.Duration, error) {
	pool, err := benchDB(ctx, pg, "latency", o.Accounts)
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
		Durable: "latency", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq: si.State.LastSeq + 1, AckWait: time.Minute, MaxAckPending: 50_000, MaxDeliver: 20,
	})
	if err != nil {
		return nil, err
	}
	total := int(float64(o.Rate) * o.Latency.Seconds())
	obs := &countObserver{done: make(chan struct{}), n: int64(total), latency: true}
	intents := pipeline.Generate(pipeline.Load{Count: total, Accounts: o.Accounts, HotAccount: o.Hot, Prefix: "lat", Seed: 9})
	err = consumeWith(ctx, js, c, pool, o, obs, func() error {
		pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
		if err != nil {
			return err
		}
		defer pub.Close()
		tick := time.NewTicker(time.Second / time.Duration(o.Rate))
		defer tick.Stop()
		for _, in := range intents {
			<-tick.C
			if err := pub.Publish(ctx, in); err != nil {
				return err
			}
		}
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
	return obs.lat, nil
}

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))].Round(100 * time.Microsecond)
}
