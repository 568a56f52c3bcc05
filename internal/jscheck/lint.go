// Operator checks of retry timing and dead-letter room, for the CLI and
// the consumer's start-up warnings; no part of the embedding API.

package jscheck

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/jitter"
)

// Defaults shared with package jsinbox, which re-exports them.
const (
	// DefaultDuplicateWindow is the server's default duplicate window.
	DefaultDuplicateWindow = 2 * time.Minute
	// DefaultMaxMsgSize is the intents stream's default largest message.
	DefaultMaxMsgSize = 8 << 10
	// DeadLetterHeadroom is what a dead-letter copy may add to an intent.
	DeadLetterHeadroom = 4 << 10
)

// CheckDeadLetterFit lists why the largest intent the intents stream
// accepts might not fit the dead-letter stream once the dead-letter headers
// are added ([DeadLetterHeadroom]): a consumer would then hold that intent
// for ever on its last delivery. maxPayload is the server's max_payload
// (nats.Conn.MaxPayload), which bounds every publish, dead letters
// included; 0 skips that check.
func CheckDeadLetterFit(intents, deadLetters jetstream.StreamConfig, maxPayload int64) []string {
	var p []string
	if intents.MaxMsgSize <= 0 {
		return append(p, fmt.Sprintf("%s has no max_msg_size: intents up to the server's max_payload are accepted, "+
			"and the largest cannot be dead-lettered with its reason; set max_msg_size (jetinbox default %d)", intents.Name, DefaultMaxMsgSize))
	}
	need := int64(intents.MaxMsgSize) + DeadLetterHeadroom
	if deadLetters.MaxMsgSize > 0 && int64(deadLetters.MaxMsgSize) < need {
		p = append(p, fmt.Sprintf("%s max_msg_size %d is below %s's %d plus %d bytes of dead-letter headers: the largest intents cannot be dead-lettered",
			deadLetters.Name, deadLetters.MaxMsgSize, intents.Name, intents.MaxMsgSize, DeadLetterHeadroom))
	}
	if maxPayload > 0 && maxPayload < need {
		p = append(p, fmt.Sprintf("the server's max_payload %d is below %s's max_msg_size %d plus %d bytes of dead-letter headers: the largest intents cannot be dead-lettered",
			maxPayload, intents.Name, intents.MaxMsgSize, DeadLetterHeadroom))
	}
	return p
}

// ConsumerTiming is the retry timing of a durable and of the consumer that
// naks its messages, for [LintConsumer]. Every field is optional; a zero
// field means the server's default or "not used", as each says.
type ConsumerTiming struct {
	// AckWait is the durable's AckWait. Zero means the server default
	// (30 s).
	AckWait time.Duration
	// MaxDeliver is the durable's MaxDeliver. Zero or negative means
	// unlimited, which is also the server's default (-1).
	MaxDeliver int
	// BackOff is the durable's BackOff list (ConsumerConfig.BackOff).
	// Empty means none.
	BackOff []time.Duration
	// BareNak reports that the consumer answers some failure with a plain
	// Nak(), which asks for immediate redelivery.
	BareNak bool
	// NakDelay is the policy whose Delay the consumer passes to
	// NakWithDelay. Nil means the consumer does not nak with a delay.
	NakDelay *jitter.Policy
}

// LintConsumer returns a human-readable warning for each retry-timing hazard
// of a durable and its consumer, or nil. It warns when:
//
//   - MaxDeliver is unlimited: a message that always fails is redelivered
//     forever;
//   - BackOff is set: a fixed list that every client shares, so after an
//     outage all redeliveries come in the same waves, and it does not apply
//     to naks at all; with NakDelay too, the server stretches each delayed
//     nak by BackOff[n] - BackOff[0]; a BackOff longer than MaxDeliver,
//     which the server rejects; an AckWait other than BackOff[0], which the
//     server replaces;
//   - BareNak is set: immediate redelivery, in lockstep with every other
//     failing consumer;
//   - NakDelay is invalid or uses no jitter ([jitter.LintPolicy]).
//
// It does not warn when NakDelay's Cap exceeds AckWait: nats-server
// schedules a delayed nak from the nak's own time (processNak sets the
// pending timestamp to now - AckWait + delay), so the delay is honoured
// however long it is.
func LintConsumer(t ConsumerTiming) []string {
	var w []string
	warn := func(format string, args ...any) { w = append(w, fmt.Sprintf(format, args...)) }

	if t.MaxDeliver <= 0 {
		warn("MaxDeliver %d means unlimited: a message that always fails is redelivered forever; "+
			"set a finite MaxDeliver and dead-letter what exhausts it", t.MaxDeliver)
	}
	if len(t.BackOff) > 0 {
		warn("consumer BackOff %v is a fixed list that every client shares: it applies the same "+
			"delays to everyone, so after an outage redeliveries arrive in synchronized waves (no "+
			"jitter), and BackOff does not apply to Nak or NakWithDelay anyway; drop it and "+
			"NakWithDelay a jittered Policy.Delay(NumDelivered)", t.BackOff)
		if t.MaxDeliver > 0 && len(t.BackOff) > t.MaxDeliver {
			warn("BackOff has %d entries but MaxDeliver is %d: the server rejects a BackOff longer "+
				"than MaxDeliver", len(t.BackOff), t.MaxDeliver)
		}
		if t.AckWait != 0 && t.AckWait != t.BackOff[0] {
			warn("AckWait %v is replaced by BackOff[0] = %v: with BackOff set the server uses it as "+
				"the ack wait", t.AckWait, t.BackOff[0])
		}
		if t.NakDelay != nil {
			warn("NakWithDelay together with BackOff: the server times a delayed nak against "+
				"BackOff[n] instead of AckWait, so each nak delay grows by up to %v "+
				"(BackOff[last] - BackOff[0])", t.BackOff[len(t.BackOff)-1]-t.BackOff[0])
		}
	}
	if t.BareNak {
		warn("a bare Nak() asks for immediate redelivery: a failing message comes straight back, " +
			"in a hot loop and in lockstep with every other client; use NakWithDelay with a " +
			"jittered Policy.Delay(NumDelivered)")
	}
	if t.NakDelay != nil {
		w = append(w, jitter.LintPolicy("NakDelay", *t.NakDelay)...)
	}
	return w
}

// PublisherTiming is a producer's retry timing and the duplicate window of
// the stream it publishes to, for [LintPublisher]. A zero field means the
// server's default or "not used", as each says.
type PublisherTiming struct {
	// PublishRetry is the producer's policy for retrying a publish whose
	// PubAck did not arrive. Nil means the producer does not retry.
	PublishRetry *jitter.Policy
	// PublishTimeout is how long one publish attempt waits for its PubAck
	// before it counts as failed; each failed attempt adds it to the retry
	// horizon. Zero means it is not counted.
	PublishTimeout time.Duration
	// DuplicateWindow is the stream's duplicate window, within which
	// JetStream drops a publish whose Nats-Msg-Id it has seen. Zero means
	// the server default, [DefaultDuplicateWindow] (2 min).
	DuplicateWindow time.Duration
}

// LintPublisher returns a human-readable warning for each retry-timing
// hazard of a producer, or nil. It warns when PublishRetry is invalid or
// uses no jitter ([jitter.LintPolicy]), and when it can keep retrying longer
// than the duplicate window (or forever), so that a late retry of a publish
// that did land is stored twice.
func LintPublisher(t PublisherTiming) []string {
	if t.PublishRetry == nil {
		return nil
	}
	p := *t.PublishRetry
	w := jitter.LintPolicy("PublishRetry", p)
	window := t.DuplicateWindow
	if window == 0 {
		window = DefaultDuplicateWindow
	}
	if h, ok := p.HorizonWithTimeout(t.PublishTimeout); !ok {
		w = append(w, fmt.Sprintf("PublishRetry has no limit (MaxAttempts 0, MaxElapsed 0): a publish can be "+
			"retried after the %v duplicate window, and a retry of a publish that did land "+
			"is then stored twice", window))
	} else if h > window {
		w = append(w, fmt.Sprintf("PublishRetry can retry a publish %v after its first attempt, longer than the %v "+
			"duplicate window: a late retry of a publish that did land is stored twice; lower "+
			"MaxAttempts or MaxElapsed, or widen the window", h, window))
	}
	return w
}
