package jitter

import (
	"fmt"
	"math"
	"time"
)

// Server defaults that Lint assumes for a zero Settings field.
const (
	// DefaultAckWait is nats-server's ack wait for a consumer that sets none.
	DefaultAckWait = 30 * time.Second
	// DefaultDuplicateWindow is nats-server's duplicate window for a stream that sets none.
	DefaultDuplicateWindow = 2 * time.Minute
)

// Settings describes the retry-related configuration of a JetStream consumer and of a producer,
// for Lint. Every field is optional; a zero field means the server's default or "not used", as
// each says.
type Settings struct {
	// AckWait is the consumer's AckWait. Zero means the server default, DefaultAckWait (30 s).
	AckWait time.Duration

	// MaxDeliver is the consumer's MaxDeliver. Zero or negative means unlimited, which is also
	// the server's default (-1).
	MaxDeliver int

	// BackOff is the consumer's BackOff list (ConsumerConfig.BackOff). Empty means none.
	BackOff []time.Duration

	// BareNak reports that the consumer answers some failure with a plain Nak(), which asks for
	// immediate redelivery.
	BareNak bool

	// NakDelay is the policy whose Delay the consumer passes to NakWithDelay. Nil means the
	// consumer does not nak with a delay.
	NakDelay *Policy

	// DuplicateWindow is the stream's duplicate window, within which JetStream drops a publish
	// whose Nats-Msg-Id it has seen. Zero means the server default, DefaultDuplicateWindow
	// (2 min).
	DuplicateWindow time.Duration

	// PublishRetry is the producer's policy for retrying a publish whose PubAck did not arrive.
	// Nil means the producer does not retry.
	PublishRetry *Policy

	// PublishTimeout is how long one publish attempt waits for its PubAck before it counts as
	// failed; each failed attempt adds it to the retry horizon. Zero means it is not counted.
	PublishTimeout time.Duration
}

// Lint returns a human-readable warning for each retry-timing hazard in s, or nil. It warns
// when:
//
//   - MaxDeliver is unlimited: a message that always fails is redelivered forever;
//   - BackOff is set: a fixed list that every client shares, so after an outage all
//     redeliveries come in the same waves, and it does not apply to naks at all; with
//     NakDelay too, the server stretches each delayed nak by BackOff[n] - BackOff[0];
//     a BackOff longer than MaxDeliver, which the server rejects; an AckWait other than
//     BackOff[0], which the server replaces;
//   - BareNak is set: immediate redelivery, in lockstep with every other failing consumer;
//   - NakDelay or PublishRetry is invalid or uses no jitter;
//   - PublishRetry can keep retrying longer than the duplicate window (or forever), so a
//     late retry of a publish that did land is stored twice.
//
// It does not warn when NakDelay's Cap exceeds AckWait: nats-server schedules a delayed nak
// from the nak's own time (processNak sets the pending timestamp to now - AckWait + delay), so
// the delay is honoured however long it is.
func Lint(s Settings) []string {
	var w []string
	warn := func(format string, args ...any) { w = append(w, fmt.Sprintf(format, args...)) }

	if s.MaxDeliver <= 0 {
		warn("MaxDeliver %d means unlimited: a message that always fails is redelivered forever; "+
			"set a finite MaxDeliver and dead-letter what exhausts it", s.MaxDeliver)
	}
	if len(s.BackOff) > 0 {
		warn("consumer BackOff %v is a fixed list that every client shares: it applies the same "+
			"delays to everyone, so after an outage redeliveries arrive in synchronized waves (no "+
			"jitter), and BackOff does not apply to Nak or NakWithDelay anyway; drop it and "+
			"NakWithDelay a jittered Policy.Delay(NumDelivered)", s.BackOff)
		if s.MaxDeliver > 0 && len(s.BackOff) > s.MaxDeliver {
			warn("BackOff has %d entries but MaxDeliver is %d: the server rejects a BackOff longer "+
				"than MaxDeliver", len(s.BackOff), s.MaxDeliver)
		}
		if s.AckWait != 0 && s.AckWait != s.BackOff[0] {
			warn("AckWait %v is replaced by BackOff[0] = %v: with BackOff set the server uses it as "+
				"the ack wait", s.AckWait, s.BackOff[0])
		}
		if s.NakDelay != nil {
			warn("NakWithDelay together with BackOff: the server times a delayed nak against "+
				"BackOff[n] instead of AckWait, so each nak delay grows by up to %v "+
				"(BackOff[last] - BackOff[0])", s.BackOff[len(s.BackOff)-1]-s.BackOff[0])
		}
	}
	if s.BareNak {
		warn("a bare Nak() asks for immediate redelivery: a failing message comes straight back, " +
			"in a hot loop and in lockstep with every other client; use NakWithDelay with a " +
			"jittered Policy.Delay(NumDelivered)")
	}
	if s.NakDelay != nil {
		lintPolicy(warn, "NakDelay", *s.NakDelay)
	}
	if s.PublishRetry != nil {
		p := *s.PublishRetry
		lintPolicy(warn, "PublishRetry", p)
		window := s.DuplicateWindow
		if window == 0 {
			window = DefaultDuplicateWindow
		}
		if h, ok := retryHorizon(p, s.PublishTimeout); !ok {
			warn("PublishRetry has no limit (MaxAttempts 0, MaxElapsed 0): a publish can be "+
				"retried after the %v duplicate window, and a retry of a publish that did land "+
				"is then stored twice", window)
		} else if h > window {
			warn("PublishRetry can retry a publish %v after its first attempt, longer than the %v "+
				"duplicate window: a late retry of a publish that did land is stored twice; lower "+
				"MaxAttempts or MaxElapsed, or widen the window", h, window)
		}
	}
	return w
}

// LintPolicy returns a warning for each hazard of p on its own, each starting with name, or
// nil: p is invalid (see Validate), or it uses no jitter, so that every client that failed at the
// same moment retries at the same moments.
func LintPolicy(name string, p Policy) []string {
	var w []string
	lintPolicy(func(format string, args ...any) { w = append(w, fmt.Sprintf(format, args...)) }, name, p)
	return w
}

func lintPolicy(warn func(string, ...any), name string, p Policy) {
	if err := p.Validate(); err != nil {
		warn("%s: %v", name, err)
	}
	if p.Kind == None {
		warn("%s uses no jitter: every client that failed at the same moment retries at the same "+
			"moments; use Decorrelated (the default) or Full", name)
	}
}

// HorizonWithTimeout bounds the time from a retry loop's first attempt to its last retry when
// each attempt waits up to timeout before it counts as failed: the waiting of Horizon plus
// timeout for each attempt before the last one, or MaxElapsed if shorter. A timeout of zero or
// less is not counted. ok is false when p has no limit (MaxAttempts 0, MaxElapsed 0).
func (p Policy) HorizonWithTimeout(timeout time.Duration) (d time.Duration, ok bool) {
	return retryHorizon(p, timeout)
}

// retryHorizon bounds the time from a publish's first attempt to its last retry: the waiting
// of Horizon plus timeout for each attempt before the last one, or MaxElapsed if shorter.
func retryHorizon(p Policy, timeout time.Duration) (time.Duration, bool) {
	p = p.normalized()
	h, ok := p.Horizon()
	if !ok || p.MaxAttempts == 0 || timeout <= 0 {
		return h, ok
	}
	if timeout > (math.MaxInt64-h)/time.Duration(p.MaxAttempts) {
		h = math.MaxInt64
	} else {
		h += time.Duration(p.MaxAttempts) * timeout
	}
	if p.MaxElapsed > 0 {
		h = min(h, p.MaxElapsed)
	}
	return h, true
}
