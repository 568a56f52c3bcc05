// The producer as a service publishes it: many callers, each publishing one
// intent at a time and waiting for its PubAck, on a server with
// sync_interval: always, with group commit and one publish per intent.

package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// callersMode is one way of publishing, measured with concurrent callers
// and at a steady low rate.
type callersMode struct {
	name    string
	batch   int // PublisherConfig.Batch
	rate    float64
	batches int64
	lat     []time.Duration // Publish at the steady rate
}

// callersResult is the callers phase: group commit and one by one.
type callersResult struct {
	callers, n, rate int
	modes            []*callersMode
}

// callersPhase measures o.Callers callers publishing one intent at a time
// with Publish, then Publish latency at o.Rate for o.Latency, with
// group commit and with one publish per intent, each on a fresh single-node
// server with sync_interval: always.
func callersPhase(ctx context.Context, o Options, say func(string, ...any)) (*callersResult, error) {
	res := &callersResult{callers: o.Callers, n: min(o.N, 20_000), rate: o.Rate}
	for _, m := range []*callersMode{{name: "group commit", batch: 0}, {name: "one by one", batch: 1}} {
		if err := m.run(ctx, o, res.n); err != nil {
			return nil, fmt.Errorf("callers phase, %s: %w", m.name, err)
		}
		say("%d callers, %s: %.0f msg/s (%d atomic batches); Publish at %d msg/s: p50 %v p99 %v",
			o.Callers, m.name, m.rate, m.batches, o.Rate, pctOrNone(m.lat, 50), pctOrNone(m.lat, 99))
		res.modes = append(res.modes, m)
	}
	return res, nil
}

func (m *callersMode) run(ctx context.Context, o Options, n int) error {
	srv, err := natsenv.StartNATS(natsenv.NATSOptions{SyncAlways: true})
	if err != nil {
		return err
	}
	defer srv.Close()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{}); err != nil {
		return err
	}
	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{Batch: m.batch, AckTimeout: 30 * time.Second})
	if err != nil {
		return err
	}
	defer pub.Close()
	intent := func(prefix string, i int64) inbox.Intent {
		return inbox.Intent{ID: prefix + strconv.FormatInt(i, 10), Subject: "intents.callers", Payload: []byte(`{"account":1,"amount":1}`)}
	}

	// Throughput: every caller takes the next intent once its own is
	// acknowledged.
	var next atomic.Int64
	errs := make(chan error, o.Callers)
	var wg sync.WaitGroup
	start := time.Now()
	for range o.Callers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if _, err := pub.Publish(ctx, intent("c-", i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	m.rate = float64(n) / time.Since(start).Seconds()
	m.batches = pub.Stats().Batches
	select {
	case err := <-errs:
		return err
	default:
	}

	// Latency at a steady rate: each intent published on time by a
	// goroutine of its own, whatever the ones before are doing.
	total := int(float64(o.Rate) * o.Latency.Seconds())
	lat := make([]time.Duration, total)
	tick := time.NewTicker(time.Second / time.Duration(o.Rate))
	defer tick.Stop()
	for i := range total {
		select {
		case <-tick.C:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Go(func() {
			t0 := time.Now()
			if _, err := pub.Publish(ctx, intent("l-", int64(i))); err != nil {
				select {
				case errs <- err:
				default:
				}
				return
			}
			lat[i] = time.Since(t0)
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	m.lat = lat
	return nil
}

func pctOrNone(d []time.Duration, p float64) string {
	if len(d) == 0 {
		return "-"
	}
	return pct(d, p).String()
}

// write prints the phase in the producer section.
func (r *callersResult) write(w io.Writer) {
	fmt.Fprintf(w, "producer, %d callers each publishing one intent at a time (Publish, %d intents), sync_interval always, one node:\n", r.callers, r.n)
	for _, m := range r.modes {
		fmt.Fprintf(w, "  %-13s %8.0f msg/s  %6d atomic batches  PubAck latency at %d msg/s: p50 %v  p99 %v\n",
			m.name, m.rate, m.batches, r.rate, pctOrNone(m.lat, 50), pctOrNone(m.lat, 99))
	}
	if len(r.modes) == 2 && r.modes[1].rate > 0 {
		fmt.Fprintf(w, "  group commit / one by one: %.1fx\n", r.modes[0].rate/r.modes[1].rate)
	}
}
