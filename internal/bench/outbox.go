// The outbox measured: the consumer whose ledger emits a follow-up per
// credit into the outbox, the relay's throughput draining it, and
// emit-to-publish latency with the relay running beside the consumer.

package bench

import (
	"context"
	"fmt"
	"github.com/jackc/pgx/v5"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/outbox"
)

// The stream the follow-ups go to.
const (
	followStream  = "NOTIFICATIONS"
	followSubject = "notifications"
)

// handler returns the effect of the jetinbox approaches: the ledger, with a
// follow-up per credit for the outbox approach.
func (o Options) handler() (inbox.Handler[pgx.Tx], error) {
	if !o.followUps {
		return effects.NewLedger(), nil
	}
	return effects.NewLedger().WithFollowUps(effects.FollowUps{Subject: followSubject, Kind: o.followKind})
}

// relayRun is what the relay did in one round: how fast it drained the
// outbox.
type relayRun struct {
	rate float64
}

// lagCollector keeps the emit-to-publish times the relay reports.
type lagCollector struct {
	mu   sync.Mutex
	lags []time.Duration
}

func (l *lagCollector) add(d []time.Duration) {
	l.mu.Lock()
	l.lags = append(l.lags, d...)
	l.mu.Unlock()
}

func (l *lagCollector) all() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Duration(nil), l.lags...)
}

func newRelay(store *cli.Store, js jetstream.JetStream, o Options, lags *lagCollector) (*outbox.Relay, error) {
	cfg := outbox.RelayConfig{Stream: followStream, Batch: 1000, Publisher: jsinbox.PublisherConfig{Batch: o.PubBatch, MaxInFlight: 8192}}
	if lags != nil {
		cfg.Observer = outbox.SentFunc(lags.add)
	}
	// A LISTEN through a pooler in transaction mode hears nothing: poll.
	cfg.NoListen = store.Pooled
	return outbox.NewRelay(store.Outbox(), js, cfg)
}

// runOutbox runs the jetinbox consumer with follow-ups (its rate is the
// approach's), then a relay that drains the n rows it emitted, timed on its
// own, and checks every row went out once.
func runOutbox(ctx context.Context, js jetstream.JetStream, c jetstream.Consumer, pool *cli.Store, n int, o Options, relays *[]relayRun) (time.Duration, error) {
	// The rounds read the same intents: a kind per round (its durable's
	// name) keeps their follow-up IDs apart, or the stream would take
	// every later round's as duplicates.
	o.followUps, o.followKind = true, c.CachedInfo().Name
	start := time.Now()
	if err := runJetinbox(ctx, js, c, pool, n, o); err != nil {
		return 0, err
	}
	consumed := time.Since(start)
	r, err := newRelay(pool, js, o, nil)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	rs := time.Now()
	for {
		k, err := r.Drain(ctx)
		if err != nil {
			return 0, fmt.Errorf("relay: %w", err)
		}
		if k == 0 {
			break
		}
	}
	el := time.Since(rs)
	if s := r.Stats(); s.Sent != int64(n) || s.Duplicates != 0 {
		return 0, fmt.Errorf("relay sent %d rows (%d duplicates), want %d", s.Sent, s.Duplicates, n)
	}
	*relays = append(*relays, relayRun{rate: float64(n) / el.Seconds()})
	return consumed, nil
}
