// The horizon: the span after which a message ID can no longer reach the
// inbox again, so the least time inbox rows must be kept. `jetinbox prune`
// refuses to delete rows younger than it, and `jetinbox verify` warns
// (CheckHorizons) when the retention in use is not longer. Both compute it
// here, with ComputeHorizon, whose doc gives the derivation.

package jscheck

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/jitter"
)

// Defaults the horizon assumes for the settings the servers do not hold:
// those of a [ConsumerConfig] left zero.
const (
	// DefaultNakCap is the consumer's default longest nak delay.
	DefaultNakCap = 30 * time.Second
	// DefaultAckWait and DefaultMaxDeliver are what the consumer creates a
	// missing durable with.
	DefaultAckWait    = 30 * time.Second
	DefaultMaxDeliver = 20
)

// DefaultPublishRetryHorizon is the retry horizon of the publisher's default
// policy (jitter.Default()).
func DefaultPublishRetryHorizon() time.Duration {
	h, _ := jitter.Default().Horizon()
	return h
}

// ErrUnboundedHorizon is returned when some setting lets a message come back
// after any time: a stream or dead-letter stream without MaxAge, or
// unlimited deliveries.
var ErrUnboundedHorizon = errors.New("horizon: messages can come back after any time")

// HorizonInputs are the settings the horizon depends on.
type HorizonInputs struct {
	// Stream is the intents stream's configuration. Its MaxAge and
	// Duplicates count.
	Stream jetstream.StreamConfig
	// DeadLetters is the dead-letter stream's configuration when dead
	// letters may be re-published with their IDs; nil leaves re-drives
	// out.
	DeadLetters *jetstream.StreamConfig
	// Consumer is the durable's configuration (AckWait, BackOff,
	// MaxDeliver). Nil: the consumer's defaults (AckWait 30s, MaxDeliver
	// 20), as it creates a missing durable.
	Consumer *jetstream.ConsumerConfig
	// NakCap is the consumer's longest nak delay. Default 30s.
	NakCap time.Duration
	// PublishRetry is the producer's retry horizon. Default
	// DefaultPublishRetryHorizon().
	PublishRetry time.Duration
}

// HorizonSpan is the computed horizon and its parts.
type HorizonSpan struct {
	// Total is H: how long after an inbox row was written its message ID
	// can still reach the inbox.
	Total time.Duration
	// Redelivery is R, Life is max(MaxAge, R), Late is max(duplicate
	// window, producer retry horizon), Redrive is DLQ MaxAge + Life (0 if
	// re-drives do not count).
	Redelivery, Life, Late, Redrive time.Duration
	// Why says which settings gave each part, for people.
	Why string
}

// ComputeHorizon returns the horizon for in, or an error wrapping
// [ErrUnboundedHorizon].
//
// Let t0 be when an inbox row was written (its received_at). The same
// message ID reaches the inbox again only through a stream message carrying
// it, and a stream message can reach a consumer only while it is in the
// stream: MaxAge after it was stored (replays, a backlog, redeliveries and
// the max-deliveries rescue all read it from the stream). For good measure
// the redelivery span R is taken as a bound too, in case a consumer still
// holds a message the stream has dropped:
//
//	R    = MaxDeliver × (max(AckWait, last BackOff) + longest nak delay)
//	life = max(MaxAge, R)
//
// Each of at most MaxDeliver deliveries ends with the server redelivering
// after AckWait (or the BackOff step) or with a nak whose delay is at most
// the nak cap; R adds both for every delivery.
//
// The message that made the row was stored before t0. Another copy of the
// same ID can be stored later: a producer's retry after its PubAck was lost
// is dropped by the server inside the duplicate window, so a copy lands only
// when the producer is still retrying after the window, at most its retry
// horizon after the first copy:
//
//	late = max(duplicate window, producer retry horizon)
//
// so every copy a producer makes is in the stream no later than t0 + late, and
// gone (or settled) by
//
//	H = late + life
//
// Dead letters can be re-published into the stream with their original ID
// (Jetinbox-Message-Id) while they are kept, DLQ MaxAge after they were
// written; a dead letter is written at most H after t0, and the re-published
// copy then lives like any other. If re-drives count:
//
//	H = late + life + DLQ MaxAge + life
//
// The times involved come from two kinds of clocks: MaxAge and the duplicate
// window run on the NATS servers', received_at and the prune cut-off on
// PostgreSQL's. pginbox.Store.Prune takes its cut-off from PostgreSQL's now() alone
// and requires the retention to be longer than H plus a margin
// (inbox.DefaultPruneMargin) that absorbs the skew between those clocks and
// the time a batch spends between delivery and commit.
//
// An ID that an upstream system publishes again, on purpose, later than H is
// outside any horizon: the inbox keeps its promise only for copies inside it.
func ComputeHorizon(in HorizonInputs) (HorizonSpan, error) {
	if in.NakCap <= 0 {
		in.NakCap = DefaultNakCap
	}
	if in.PublishRetry <= 0 {
		in.PublishRetry = DefaultPublishRetryHorizon()
	}
	if in.Stream.MaxAge <= 0 {
		return HorizonSpan{}, fmt.Errorf("%w: stream %s keeps messages forever (MaxAge 0): any pruned row could be replayed into a duplicate; set a MaxAge", ErrUnboundedHorizon, in.Stream.Name)
	}
	c := jetstream.ConsumerConfig{AckWait: DefaultAckWait, MaxDeliver: DefaultMaxDeliver}
	consumer := "the consumer's defaults"
	if in.Consumer != nil {
		c = *in.Consumer
		consumer = "durable " + c.Durable
	}
	if c.MaxDeliver < 1 {
		return HorizonSpan{}, fmt.Errorf("%w: %s has unlimited MaxDeliver: a failing message is redelivered forever", ErrUnboundedHorizon, consumer)
	}
	step := c.AckWait
	if n := len(c.BackOff); n > 0 {
		step = max(step, c.BackOff[n-1])
	}
	var s HorizonSpan
	s.Redelivery = mulSat(c.MaxDeliver, addSat(step, in.NakCap))
	s.Life = max(in.Stream.MaxAge, s.Redelivery)
	s.Late = max(in.Stream.Duplicates, in.PublishRetry)
	s.Total = addSat(s.Late, s.Life)
	why := []string{
		fmt.Sprintf("late copies %v = max(duplicate window %v, producer retry horizon %v)", s.Late, in.Stream.Duplicates, in.PublishRetry),
		fmt.Sprintf("stream life %v = max(stream %s MaxAge %v, redelivery %v = %s MaxDeliver %d × (AckWait/BackOff %v + nak cap %v))",
			s.Life, in.Stream.Name, in.Stream.MaxAge, s.Redelivery, consumer, c.MaxDeliver, step, in.NakCap),
	}
	if d := in.DeadLetters; d != nil {
		if d.MaxAge <= 0 {
			return HorizonSpan{}, fmt.Errorf("%w: dead-letter stream %s keeps messages forever (MaxAge 0): a re-drive could come back after any time", ErrUnboundedHorizon, d.Name)
		}
		s.Redrive = addSat(d.MaxAge, s.Life)
		s.Total = addSat(s.Total, s.Redrive)
		why = append(why, fmt.Sprintf("re-drives %v = dead-letter stream %s MaxAge %v + stream life", s.Redrive, d.Name, d.MaxAge))
	}
	s.Why = strings.Join(why, "; ")
	return s, nil
}

// HorizonOptions are the settings [CheckHorizons] cannot read from the
// servers.
type HorizonOptions struct {
	// Retention is how long inbox rows are kept (the Prune OlderThan in
	// use). Zero: never pruned.
	Retention time.Duration
	// NakCap is the consumer's longest nak delay. Default
	// [DefaultNakCap] (30s).
	NakCap time.Duration
	// PublishRetry is the producer's retry horizon. Default
	// [DefaultPublishRetryHorizon].
	PublishRetry time.Duration
	// Margin is how much longer than the horizon the retention must be.
	// Default inbox.DefaultPruneMargin, as for Prune.
	Margin time.Duration
	// Redrive says dead letters may be re-published with their message ID
	// while the dead-letter stream keeps them. CheckHorizons counts such
	// re-drives through DeadLetters, which a caller that sets Redrive fills
	// in from the dead-letter stream (verify does).
	Redrive bool
	// DeadLetters is the dead-letter stream's configuration, counted when
	// set.
	DeadLetters *jetstream.StreamConfig
}

// CheckHorizons names the settings under which a message could come back
// after the inbox forgot it (a duplicate effect), or be given up on. The
// horizon is computed by [ComputeHorizon], as `jetinbox prune` computes it.
func CheckHorizons(stream jetstream.StreamConfig, consumer *jetstream.ConsumerConfig, h HorizonOptions) []string {
	if h.NakCap == 0 {
		h.NakCap = DefaultNakCap
	}
	if h.PublishRetry == 0 {
		h.PublishRetry = DefaultPublishRetryHorizon()
	}
	if h.Margin == 0 {
		h.Margin = inbox.DefaultPruneMargin
	}
	var p []string
	if consumer != nil && consumer.MaxDeliver < 1 {
		p = append(p, fmt.Sprintf("durable %s has unlimited MaxDeliver: a message that keeps failing is never dead-lettered", consumer.Durable))
	}
	if h.Retention > 0 {
		span, err := ComputeHorizon(HorizonInputs{Stream: stream, DeadLetters: h.DeadLetters, Consumer: consumer, NakCap: h.NakCap, PublishRetry: h.PublishRetry})
		switch {
		case stream.MaxAge == 0:
			p = append(p, fmt.Sprintf("stream %s keeps messages forever (MaxAge 0) but inbox rows are pruned after %v: a replay or re-drive of an older message applies it again; set MaxAge below the inbox retention", stream.Name, h.Retention))
		case errors.Is(err, ErrUnboundedHorizon):
			if consumer == nil || consumer.MaxDeliver >= 1 {
				p = append(p, fmt.Sprintf("inbox rows are pruned after %v, but %v", h.Retention, err))
			}
		case err != nil:
			p = append(p, err.Error())
		case stream.MaxAge > h.Retention:
			p = append(p, fmt.Sprintf("stream MaxAge %v is longer than the inbox retention %v: a message can be replayed after its inbox row is gone; raise the retention (Prune OlderThan) above the horizon %v + margin %v (%s)",
				stream.MaxAge, h.Retention, span.Total, h.Margin, span.Why))
		case span.Redelivery > h.Retention:
			p = append(p, fmt.Sprintf("redeliveries can bring a message back %v after its first delivery, longer than the inbox retention %v (%s)", span.Redelivery, h.Retention, span.Why))
		case h.Retention <= span.Total+h.Margin:
			p = append(p, fmt.Sprintf("inbox retention %v is not longer than the horizon %v + margin %v over which a message can come back (%s)", h.Retention, span.Total, h.Margin, span.Why))
		}
	}
	if stream.Duplicates < h.PublishRetry {
		p = append(p, fmt.Sprintf("duplicate window %v is shorter than the producer's retry horizon %v: late retries become second stream messages (the inbox still drops them)", stream.Duplicates, h.PublishRetry))
	}
	return p
}

// addSat and mulSat saturate at the largest Duration.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func mulSat(n int, d time.Duration) time.Duration {
	if n > 0 && d > math.MaxInt64/time.Duration(n) {
		return math.MaxInt64
	}
	return time.Duration(n) * d
}
