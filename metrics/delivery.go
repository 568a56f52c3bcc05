package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/delivery"
)

var (
	descDeliveryPending = prometheus.NewDesc(ns+"_delivery_pending_rows", "Deliveries waiting to be sent or sent again.", nil, nil)
	descDeliveryOldest  = prometheus.NewDesc(ns+"_delivery_oldest_pending_seconds", "Age of the oldest delivery not yet delivered or dead-lettered; 0 when none is.", nil, nil)
)

// Delivery exposes a delivery dispatcher's attempts by endpoint and
// outcome, its breakers' states, and the deliveries' backlog (read from
// the database at scrape time). Give it to the dispatcher as its
// Config.Observer.
type Delivery struct {
	attempts *prometheus.CounterVec
	took     *prometheus.HistogramVec
	breaker  *prometheus.GaugeVec
	dead     *prometheus.CounterVec
	backlog  func(context.Context) (int64, time.Duration, error)
}

// Why a delivery was dead-lettered, as delivery_dead_letters_total labels
// it.
const (
	deadUnknown = "unknown"
	deadRefused = "refused"
)

// NewDelivery registers the delivery metrics on reg; backlog counts the
// pending rows and the age of the oldest (the store's Backlog).
func NewDelivery(reg prometheus.Registerer, backlog func(context.Context) (int64, time.Duration, error)) (*Delivery, error) {
	m := &Delivery{backlog: backlog,
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "delivery_attempts_total",
			Help: "Delivery attempts by endpoint and outcome: delivered (2xx), retry (no answer, 5xx, 408, 409, 425, 429: sent again under the same key), dead (refused for good, or outcome unknown past the key retention)."}, []string{"endpoint", "outcome"}),
		took: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "delivery_call_seconds",
			Help: "Time of one delivery call, by endpoint.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"endpoint"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "delivery_breaker_state",
			Help: "An endpoint's circuit breaker: 0 closed, 1 open, 2 half-open."}, []string{"endpoint"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "delivery_dead_letters_total",
			Help: `Deliveries dead-lettered, by endpoint and reason: unknown ("outcome unknown: reconcile": no answer known and the receiver's key retention has passed; ask the receiver before re-driving) or refused (a permanent 4xx or a redirect; fix and re-drive).`},
			[]string{"endpoint", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.attempts, m.took, m.breaker, m.dead, (*deliveryCollector)(m), buildInfo()} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue
			}
			return nil, err
		}
	}
	return m, nil
}

// Attempted implements delivery.Observer.
func (m *Delivery) Attempted(endpoint string, outcome delivery.State, took time.Duration) {
	o := string(outcome)
	if outcome == delivery.StatePending {
		o = "retry"
	}
	m.attempts.WithLabelValues(endpoint, o).Inc()
	m.took.WithLabelValues(endpoint).Observe(took.Seconds())
}

// DeadLettered implements delivery.DeadObserver.
func (m *Delivery) DeadLettered(endpoint string, unknown bool) {
	reason := deadRefused
	if unknown {
		reason = deadUnknown
	}
	m.dead.WithLabelValues(endpoint, reason).Inc()
}

// StartSeries starts the dead-letter series of every endpoint at 0, so
// that an alert's increase() sees the first dead letter.
func (m *Delivery) StartSeries(endpoints []delivery.Endpoint) {
	for _, e := range endpoints {
		m.dead.WithLabelValues(e.Name, deadUnknown)
		m.dead.WithLabelValues(e.Name, deadRefused)
	}
}

// BreakerChanged implements delivery.Observer.
func (m *Delivery) BreakerChanged(endpoint string, s delivery.BreakerState) {
	m.breaker.WithLabelValues(endpoint).Set(float64(s))
}

type deliveryCollector Delivery

func (c *deliveryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDeliveryPending
	ch <- descDeliveryOldest
}

func (c *deliveryCollector) Collect(ch chan<- prometheus.Metric) {
	if c.backlog == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, oldest, err := c.backlog(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descDeliveryPending, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(descDeliveryOldest, prometheus.GaugeValue, oldest.Seconds())
}

var _ delivery.Observer = (*Delivery)(nil)
