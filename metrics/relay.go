package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/outbox"
)

var (
	descOutboxSent       = prometheus.NewDesc(ns+"_outbox_sent_total", "Outbox rows the relay published (acknowledged by the stream) and marked sent.", nil, nil)
	descOutboxDuplicates = prometheus.NewDesc(ns+"_outbox_duplicates_total", "Of those, rows the stream held already: published before by a relay that died before marking them (or outlived its lease, on SQLite).", nil, nil)
	descOutboxFailed     = prometheus.NewDesc(ns+"_outbox_failed_total", "Outbox rows the stream refused for good (an ID it holds with another payload, a subject another stream captures), marked failed.", nil, nil)
	descOutboxRetried    = prometheus.NewDesc(ns+"_outbox_retried_total", "Outbox rows a round left pending because their publish did not get through in time.", nil, nil)
	descOutboxTakenOver  = prometheus.NewDesc(ns+"_outbox_taken_over_total", "Outbox rows the relay published but could not mark: its lease had run out and another relay had taken them (SQLite); that relay sends and marks them. Make the lease longer than a round.", nil, nil)
	descOutboxPending    = prometheus.NewDesc(ns+"_outbox_pending_rows", "Outbox rows waiting to be published.", nil, nil)
	descOutboxOldest     = prometheus.NewDesc(ns+"_outbox_oldest_pending_seconds", "Age of the oldest outbox row waiting to be published; 0 when none is.", nil, nil)
)

// Relay exposes an outbox relay's counters, the outbox's backlog (read from
// the database at scrape time) and emit-to-publish latency. Give it to the
// relay as its RelayConfig.Observer: outbox.NewRelay attaches it.
type Relay struct {
	lag     prometheus.Histogram
	backlog func(context.Context) (int64, time.Duration, error)
	r       *outbox.Relay
}

// NewRelay registers the relay metrics on reg; backlog counts the pending
// rows and the age of the oldest (the outbox store's Backlog).
func NewRelay(reg prometheus.Registerer, backlog func(context.Context) (int64, time.Duration, error)) (*Relay, error) {
	m := &Relay{backlog: backlog, lag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "outbox_emit_to_publish_seconds",
		Help: "Time from the start of the transaction that added an outbox row to the relay marking it sent.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)})}
	for _, c := range []prometheus.Collector{m.lag, (*relayCollector)(m), buildInfo()} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue // build info is shared with a consumer in the same process
			}
			return nil, err
		}
	}
	return m, nil
}

// Attach points the scrape-time metrics at r.
func (m *Relay) Attach(r *outbox.Relay) { m.r = r }

// ObserveSent records the emit-to-publish time of rows marked sent.
func (m *Relay) ObserveSent(lags []time.Duration) {
	for _, d := range lags {
		m.lag.Observe(d.Seconds())
	}
}

type relayCollector Relay

func (c *relayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOutboxSent, descOutboxDuplicates, descOutboxFailed, descOutboxRetried, descOutboxTakenOver, descOutboxPending, descOutboxOldest} {
		ch <- d
	}
}

func (c *relayCollector) Collect(ch chan<- prometheus.Metric) {
	if c.r != nil {
		s := c.r.Stats()
		ch <- prometheus.MustNewConstMetric(descOutboxSent, prometheus.CounterValue, float64(s.Sent))
		ch <- prometheus.MustNewConstMetric(descOutboxDuplicates, prometheus.CounterValue, float64(s.Duplicates))
		ch <- prometheus.MustNewConstMetric(descOutboxFailed, prometheus.CounterValue, float64(s.Failed))
		ch <- prometheus.MustNewConstMetric(descOutboxRetried, prometheus.CounterValue, float64(s.Retried))
		ch <- prometheus.MustNewConstMetric(descOutboxTakenOver, prometheus.CounterValue, float64(s.TakenOver))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if n, oldest, err := c.backlog(ctx); err == nil {
		ch <- prometheus.MustNewConstMetric(descOutboxPending, prometheus.GaugeValue, float64(n))
		ch <- prometheus.MustNewConstMetric(descOutboxOldest, prometheus.GaugeValue, oldest.Seconds())
	}
}
