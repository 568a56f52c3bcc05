// Package metrics exposes a jetinbox consumer's and publisher's work as
// Prometheus metrics, on a registry the caller gives: nothing is registered
// globally.
//
// Counters that the consumer and publisher already keep are read at scrape
// time; per-batch figures (sizes, durations, publish-to-commit latency,
// rejections by reason) come from the consumer's Observer hook.
package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/version"
)

const ns = "jetinbox"

// Consumer observes a jsinbox.Consumer. Set it as ConsumerConfig.Observer
// and call Attach once the Consumer exists.
type Consumer struct {
	rejected        *prometheus.CounterVec
	naks            *prometheus.CounterVec
	batchSize       prometheus.Histogram
	batchDuration   prometheus.Histogram
	publishToCommit prometheus.Histogram

	c *jsinbox.Consumer
}

// NewConsumer registers the consumer metrics on reg.
func NewConsumer(reg prometheus.Registerer) (*Consumer, error) {
	m := &Consumer{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "rejected_total",
			Help: "Messages rejected by the inbox, by reason: bad_input, invalid_id, invalid_subject, claim_refused, panic, gave_up, permanent, conflict."}, []string{"reason"}),
		naks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "retries_total",
			Help: "Messages handed back for a later delivery with a jittered delay, by reason: transient (the effect asked for a retry) or batch_failed (database unreachable or commit outcome unknown)."}, []string{"reason"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "batch_size_messages",
			Help: "Messages per inbox transaction.", Buckets: prometheus.ExponentialBuckets(1, 4, 7)}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "batch_duration_seconds",
			Help: "Time from BEGIN to the end of COMMIT of one batch.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		publishToCommit: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "publish_to_commit_seconds",
			Help: "Time from the stream storing a message to the commit of its inbox row.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
	}
	for _, c := range []prometheus.Collector{m.rejected, m.naks, m.batchSize, m.batchDuration, m.publishToCommit, (*consumerCollector)(m), buildInfo()} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Attach points the scrape-time metrics at c. jsinbox.NewConsumer calls it
// for a Consumer given as its Observer.
func (m *Consumer) Attach(c *jsinbox.Consumer) { m.c = c }

// ObserveBatch implements jsinbox.Observer.
func (m *Consumer) ObserveBatch(b jsinbox.BatchReport) {
	m.batchSize.Observe(float64(len(b.Messages)))
	m.batchDuration.Observe(b.Ended.Sub(b.Began).Seconds())
	for i, o := range b.Outcomes {
		switch o.Status {
		case inbox.StatusApplied:
			if p := b.Messages[i].Published; !p.IsZero() {
				m.publishToCommit.Observe(b.Ended.Sub(p).Seconds())
			}
		case inbox.StatusRejected, inbox.StatusConflict:
			if !o.AlreadyInInbox {
				m.rejected.WithLabelValues(RejectReason(o)).Inc()
			}
		case inbox.StatusRetry:
			reason := "transient"
			if o.Cause == inbox.CauseBatchFailed {
				reason = "batch_failed"
			}
			m.naks.WithLabelValues(reason).Inc()
		}
	}
}

// RejectReason maps an outcome to a bounded label value by its
// [inbox.Cause]: reasons are free text, labels must not be, and a reason's
// wording must not move a rejection to another label.
func RejectReason(o inbox.Outcome) string {
	switch o.Cause {
	case inbox.CauseConflict:
		return "conflict"
	case inbox.CauseInvalidID:
		return "invalid_id"
	case inbox.CauseInvalidSubject:
		return "invalid_subject"
	case inbox.CauseClaimRefused:
		return "claim_refused"
	case inbox.CausePanic:
		return "panic"
	case inbox.CauseGaveUp:
		return "gave_up"
	case inbox.CauseBadInput:
		return "bad_input"
	}
	if o.Status == inbox.StatusConflict {
		return "conflict"
	}
	return "permanent"
}

var (
	descReceived     = prometheus.NewDesc(ns+"_received_total", "Messages delivered to the consumer, redeliveries included.", nil, nil)
	descApplied      = prometheus.NewDesc(ns+"_applied_total", "Messages whose inbox row and effect committed.", nil, nil)
	descDuplicates   = prometheus.NewDesc(ns+"_duplicates_total", "Duplicates dropped, by layer: inbox (a redelivery found its row) or server (JetStream's duplicate window).", []string{"layer"}, nil)
	descConflicts    = prometheus.NewDesc(ns+"_conflicts_total", "Messages whose ID was already applied with a different payload.", nil, nil)
	descRedeliveries = prometheus.NewDesc(ns+"_redeliveries_total", "Messages received with a delivery count above 1.", nil, nil)
	descDeadLetters  = prometheus.NewDesc(ns+"_dead_letters_total", "Messages published to the dead-letter stream and terminated.", nil, nil)
	descBatches      = prometheus.NewDesc(ns+"_batches_total", "Batches processed.", nil, nil)
	descFailed       = prometheus.NewDesc(ns+"_failed_batches_total", "Batches that failed as a whole (nothing acked).", nil, nil)
	descInFlight     = prometheus.NewDesc(ns+"_batches_in_flight", "Batches being processed now.", nil, nil)
	descPending      = prometheus.NewDesc(ns+"_consumer_pending_messages", "Messages in the stream not yet delivered to the durable (server's view).", nil, nil)
	descAckPending   = prometheus.NewDesc(ns+"_consumer_ack_pending_messages", "Messages delivered and not yet acked (server's view).", nil, nil)
	descCopyClaims   = prometheus.NewDesc(ns+"_copy_claim_batches_total", "Batches of first deliveries claimed with COPY (the fast path).", nil, nil)
	descHeld         = prometheus.NewDesc(ns+"_dead_letters_held", "Messages on their final delivery that the dead-letter stream refused (missing, full) and that the consumer holds and retries; above 0 the consumer is not ready.", nil, nil)
	descRepeats      = prometheus.NewDesc(ns+"_rejected_repeats_total", "Copies of an intent rejected before at another stream sequence (a re-publish of the rejected ID), terminated without a second dead letter.", nil, nil)
	descRescued      = prometheus.NewDesc(ns+"_rescued_total", "Messages the server gave up on after MaxDeliver, settled from their stored advisory.", nil, nil)
	descExpired      = prometheus.NewDesc(ns+"_rescue_expired_total", "Messages the server gave up on after MaxDeliver that aged out of the stream before their rescue: fate unknown, recorded in the dead-letter stream as expired (jetinbox verify counts them as violations).", nil, nil)
	descForeignAdv   = prometheus.NewDesc(ns+"_rescue_foreign_advisories_total", "Messages in the advisory stream that were no max-deliveries advisory of this durable (a server answer routed there by a reply subject, garbage, or one naming a message the stream never held): terminated, nothing rescued.", nil, nil)
	descStaleReads   = prometheus.NewDesc(ns+"_rescue_stale_reads_total", "Read-backs of a message the server gave up on that found nothing while the stream, as its leader reports it, still holds the message (a replica or mirror behind the leader answered): the advisory is left unsettled and tried again, the message never recorded as expired for it.", nil, nil)
	descRescueBack   = prometheus.NewDesc(ns+"_rescue_backlog", "Max-deliveries advisories of the durable not yet settled (the rescue durable's pending and unacked): messages the server gave up on that wait for their rescue. Settled means applied or found applied, dead-lettered, recorded as expired, or refused as foreign. A rescue settles thousands a second; a backlog that stays above 0 means the rescue cannot settle (database down, dead-letter stream refusing).", nil, nil)
	descLeft         = prometheus.NewDesc(ns+"_left_for_rescue_total", "Messages on their last delivery left unsettled because what kept them from being applied was not their fault (the database unavailable, read-only, unmigrated or without a grant; a partition moved away): the server gives up on each after AckWait and the rescue applies it from its advisory.", nil, nil)
	descCopyFallback = prometheus.NewDesc(ns+"_copy_claim_fallbacks_total", "Batches whose COPY claim met an ID already claimed and were claimed again with conflict checks (a replay, or copies published after the stream's duplicate window).", nil, nil)
	descStreamFill   = prometheus.NewDesc(ns+"_stream_fill_ratio", "How full the consumer's streams are against max_msgs or max_bytes, whichever is closer (1 is full; they discard new messages): intents (full: publishes refused), dead letters (full: messages to dead-letter held), advisories (full: the server's give-ups lost).", []string{"stream"}, nil)
)

type consumerCollector Consumer

func (c *consumerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReceived, descApplied, descDuplicates, descConflicts, descRedeliveries, descDeadLetters, descBatches, descFailed, descInFlight, descPending, descAckPending, descCopyClaims, descCopyFallback, descHeld, descRepeats, descRescued, descExpired, descForeignAdv, descStaleReads, descRescueBack, descLeft, descStreamFill} {
		ch <- d
	}
}

func (c *consumerCollector) Collect(ch chan<- prometheus.Metric) {
	if c.c == nil {
		return
	}
	s := c.c.Stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descReceived, s.Received)
	counter(descApplied, s.Applied)
	counter(descDuplicates, s.Duplicates, "inbox")
	counter(descConflicts, s.Conflicts)
	counter(descRedeliveries, s.Redeliveries)
	counter(descDeadLetters, s.DeadLettered)
	counter(descBatches, s.Batches)
	counter(descFailed, s.FailedBatches)
	counter(descCopyClaims, s.CopyClaims)
	counter(descCopyFallback, s.CopyFallbacks)
	counter(descRepeats, s.RejectedRepeats)
	counter(descRescued, s.Rescued)
	counter(descExpired, s.RescueExpired)
	counter(descForeignAdv, s.ForeignAdvisories)
	counter(descLeft, s.LeftForRescue)
	counter(descStaleReads, s.RescueStaleReads)
	ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, float64(s.DeadLettersHeld))
	ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(s.InFlight))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if info, err := c.c.Info(ctx); err == nil {
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(info.NumPending))
		ch <- prometheus.MustNewConstMetric(descAckPending, prometheus.GaugeValue, float64(info.NumAckPending))
	}
	if n, err := c.c.RescueBacklog(ctx); err == nil {
		ch <- prometheus.MustNewConstMetric(descRescueBack, prometheus.GaugeValue, float64(n))
	}
	// What the server could answer: a stream it could not is left out for
	// this scrape rather than reported empty.
	usage, _ := c.c.StreamUsage(ctx)
	for _, u := range usage {
		ch <- prometheus.MustNewConstMetric(descStreamFill, prometheus.GaugeValue, u.Fill(), u.Stream)
	}
}

var (
	descPublished    = prometheus.NewDesc(ns+"_published_total", "Intents whose publish the stream acknowledged.", nil, nil)
	descRetries      = prometheus.NewDesc(ns+"_publish_retries_total", "Publishes sent again, with the same ID, after a timeout or error.", nil, nil)
	descFailures     = prometheus.NewDesc(ns+"_publish_failures_total", "Intents not published: retry budget spent, subject in another stream, or a conflict.", nil, nil)
	descPubConflicts = prometheus.NewDesc(ns+"_publish_conflicts_total", "Intents whose ID the stream already held with a different payload, inside its duplicate window: not published, counted in failures too.", nil, nil)
)

// Publisher exposes a jsinbox.Publisher's counters.
type Publisher struct{ p *jsinbox.Publisher }

// NewPublisher registers the publisher metrics on reg.
func NewPublisher(reg prometheus.Registerer, p *jsinbox.Publisher) (*Publisher, error) {
	m := &Publisher{p: p}
	for _, c := range []prometheus.Collector{m, buildInfo()} {
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

// Describe implements prometheus.Collector.
func (m *Publisher) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPublished
	ch <- descRetries
	ch <- descFailures
	ch <- descPubConflicts
	ch <- descDuplicates
}

// Collect implements prometheus.Collector.
func (m *Publisher) Collect(ch chan<- prometheus.Metric) {
	s := m.p.Stats()
	ch <- prometheus.MustNewConstMetric(descPublished, prometheus.CounterValue, float64(s.Published))
	ch <- prometheus.MustNewConstMetric(descRetries, prometheus.CounterValue, float64(s.Retries))
	ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, float64(s.Failed))
	ch <- prometheus.MustNewConstMetric(descPubConflicts, prometheus.CounterValue, float64(s.Conflicts))
	ch <- prometheus.MustNewConstMetric(descDuplicates, prometheus.CounterValue, float64(s.Duplicates), "server")
}

// buildInfo is jetinbox_build_info{version, goversion} = 1.
func buildInfo() prometheus.Collector {
	v, goVersion := version.String(), version.Go()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "build_info",
		Help: "Build information; always 1.", ConstLabels: prometheus.Labels{"version": v, "goversion": goVersion}})
	g.Set(1)
	return g
}
