package jsinbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/hook"
)

// The server gives up on a message after MaxDeliver deliveries even when
// nobody settled it: a consumer that crashed, or whose AckWait ran out, on
// the last delivery. It says so once, in a max-deliveries advisory on core
// NATS, whether or not anyone listens. A rescue that depends on hearing it
// loses every message given up on while no consumer runs (or under a role
// that may not subscribe). So the advisories are kept in a stream of their
// own, which the server fills whether or not a consumer runs, and each
// consumer drains its durable's advisories there, at start and while it
// runs: the message is read back from the intents stream and settled,
// applied once or dead-lettered with a reason.

// AdvisoryStream returns the name of the stream that keeps the
// max-deliveries advisories of the consumers of an intents stream.
func AdvisoryStream(stream string) string { return stream + "_ADVISORIES" }

// maxDeliveriesSubject is the subject of durable's max-deliveries
// advisories; durable "*" matches every consumer of stream.
func maxDeliveriesSubject(stream, durable string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + durable
}

// Limits of the advisory stream. An advisory is about 300 bytes.
const (
	advisoryMaxMsgs  = 10_000_000
	advisoryMaxBytes = 4 << 30
)

// AdvisoryOutlives is how much longer than the intents stream's max_age
// the advisory stream keeps advisories. A rescue needs the advisory; the
// message it names may be gone by then, and only a kept advisory lets the
// rescue record that (see [DeadLetterExpired]). Kept as long as a dead
// letter by default: consumers down longer than the intents' max_age
// still find every give-up and record the ones that expired.
const AdvisoryOutlives = DefaultDeadLetterMaxAge

// AdvisoryConfig returns the configuration of the advisory stream: the
// max-deliveries advisories of every consumer of the intents stream, kept
// [AdvisoryOutlives] longer than the intents (forever if the intents are),
// with the intents stream's replicas.
func (o StreamConfig) AdvisoryConfig() jetstream.StreamConfig { return advisoryConfig(o.Config()) }

func advisoryConfig(intents jetstream.StreamConfig) jetstream.StreamConfig {
	maxAge := intents.MaxAge
	if maxAge > 0 {
		maxAge += AdvisoryOutlives
	}
	return jetstream.StreamConfig{
		Name:       AdvisoryStream(intents.Name),
		Subjects:   []string{maxDeliveriesSubject(intents.Name, "*")},
		Storage:    jetstream.FileStorage,
		Replicas:   intents.Replicas,
		Retention:  jetstream.LimitsPolicy,
		Discard:    jetstream.DiscardNew,
		MaxMsgs:    advisoryMaxMsgs,
		MaxBytes:   advisoryMaxBytes,
		MaxAge:     maxAge,
		DenyDelete: true,
		DenyPurge:  true,
	}
}

// bindRescue finds (or creates) the advisory stream and the durable's
// consumer on it. The consumer has the durable's name and reads only that
// durable's advisories; it never gives up (a rescue that fails for a
// passing reason is naked and tried again).
func (c *Consumer) bindRescue(ctx context.Context) (jetstream.Consumer, error) {
	name := AdvisoryStream(c.cfg.Stream)
	s, err := c.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		var intents jetstream.Stream
		if intents, err = c.js.Stream(ctx, c.cfg.Stream); err == nil {
			s, err = c.js.CreateStream(ctx, advisoryConfig(intents.CachedInfo().Config))
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				s, err = c.js.Stream(ctx, name)
			}
		}
	}
	if err != nil {
		return nil, setupError(fmt.Errorf("jsinbox: advisory stream %s, which keeps the max-deliveries advisories a consumer rescues messages from, could not be found or created: "+
			"create it with jetinbox's producer (EnsureStream), or nats stream add %s --config deploy/jetstream/advisories-stream.json: %w", name, name, err))
	}
	if problems := checkAdvisory(s.CachedInfo().Config); len(problems) > 0 {
		return nil, &SetupError{Err: fmt.Errorf("jsinbox: existing stream %s is unsafe: %v", name, problems)}
	}
	cons, err := s.Consumer(ctx, c.cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = s.CreateConsumer(ctx, jetstream.ConsumerConfig{
			Durable:       c.cfg.Durable,
			FilterSubject: maxDeliveriesSubject(c.cfg.Stream, c.cfg.Durable),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       c.cfg.AckWait,
			MaxDeliver:    -1,
			MaxAckPending: 64,
		})
		if errors.Is(err, jetstream.ErrConsumerExists) {
			cons, err = s.Consumer(ctx, c.cfg.Durable)
		}
	}
	if err != nil {
		return nil, setupError(fmt.Errorf("jsinbox: rescue consumer %s on %s (refused by the server: check the account's permissions, "+
			"or create it with nats consumer add %s --config deploy/jetstream/ledger-rescue-consumer.json): %w", c.cfg.Durable, name, name, err))
	}
	return cons, nil
}

// startRescue drains the durable's advisories, one at a time, until the
// returned stop is called; stop waits for a rescue in progress. A simulated
// crash during a rescue is handed to onCrash.
func (c *Consumer) startRescue(ctx context.Context, cons jetstream.Consumer, onCrash func(error)) (stop func(), err error) {
	var mu sync.Mutex
	stopped := false
	cc, err := cons.Consume(func(m jetstream.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if stopped || c.crashed.Load() {
			return // a stopped or dead consumer settles nothing
		}
		c.rescue(ctx, m, onCrash)
	}, jetstream.PullMaxMessages(16), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		c.cfg.logger.Debug("jsinbox: rescue consume", "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("jsinbox: consume advisories: %w", err)
	}
	return func() {
		cc.Stop()
		mu.Lock()
		stopped = true
		mu.Unlock()
	}, nil
}

// rescued is a message the server gave up on, read back from the stream,
// settled through its advisory: keeping it alive keeps the advisory,
// naking it brings the advisory back later, terminating it (the message
// is dead-lettered) acks the advisory.
type rescued struct {
	raw *jetstream.RawStreamMsg
	adv jetstream.Msg
}

func (r rescued) Headers() nats.Header               { return r.raw.Header }
func (r rescued) Subject() string                    { return r.raw.Subject }
func (r rescued) Data() []byte                       { return r.raw.Data }
func (r rescued) InProgress() error                  { return r.adv.InProgress() }
func (r rescued) NakWithDelay(d time.Duration) error { return r.adv.NakWithDelay(d) }
func (r rescued) TermWithReason(string) error        { return r.adv.Ack() }

// maxDeliverType is the type of the server's max-deliveries advisory.
const maxDeliverType = "io.nats.jetstream.advisory.v1.max_deliver"

// maxDeliverAdvisory is the part of a max-deliveries advisory the rescue
// reads.
type maxDeliverAdvisory struct {
	Type       string `json:"type"`
	ID         string `json:"id"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// genuineAdvisory parses adv and says why it is not a max-deliveries
// advisory of this consumer's durable ("" if it is one). NATS does not
// check reply subjects against permissions, so a key that may only make
// requests can have the server's answer (a JetStream API response, or a
// direct get of a message whose payload the key chose) stored in the
// advisory stream; such a message must never make the rescue read back,
// apply or dead-letter anything. The server publishes its advisories
// without headers; an answer to a direct get carries the stored message's
// Nats-Stream and Nats-Sequence, and a copy of a stored message its
// Nats-Msg-Id.
func (c *Consumer) genuineAdvisory(adv jetstream.Msg) (maxDeliverAdvisory, string) {
	var a maxDeliverAdvisory
	if h := adv.Headers(); h != nil {
		for _, k := range [...]string{jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.MsgIDHeader} {
			if _, ok := h[k]; ok {
				return a, "carries the " + k + " header of a stored message, which the server's advisories never do"
			}
		}
	}
	if err := json.Unmarshal(adv.Data(), &a); err != nil {
		return a, "not JSON: " + err.Error()
	}
	switch {
	case a.Type != maxDeliverType:
		return a, fmt.Sprintf("type %q, not %s", a.Type, maxDeliverType)
	case a.Stream != c.cfg.Stream || a.Consumer != c.cfg.Durable:
		return a, fmt.Sprintf("names consumer %q of stream %q, not %s of %s", a.Consumer, a.Stream, c.cfg.Durable, c.cfg.Stream)
	case a.StreamSeq == 0 || a.Deliveries == 0 || a.ID == "":
		return a, "no stream sequence, delivery count or advisory id"
	}
	return a, ""
}

// rescue settles the message an advisory names: it runs it through the
// inbox once more as a final delivery, so it ends applied (or found
// applied) or dead-lettered with a reason. A database or stream that
// fails now naks the advisory, to try again later. A message that is not
// a genuine advisory is terminated and counted; one for a message that
// aged out of the stream first is recorded in the dead-letter stream
// (see [DeadLetterExpired]) before it is acked.
func (c *Consumer) rescue(ctx context.Context, adv jetstream.Msg, onCrash func(error)) {
	a, why := c.genuineAdvisory(adv)
	if why != "" {
		c.foreignAdvisories.Add(1)
		c.cfg.logger.Error("jsinbox: a message in the advisory stream is no max-deliveries advisory of this durable; terminated, nothing rescued",
			"subject", adv.Subject(), "durable", c.cfg.Durable, "why", why)
		_ = adv.Term()
		return
	}
	retry := func(what string, err error) {
		c.cfg.logger.Warn("jsinbox: rescue after max deliveries failed; trying again later", "stream_seq", a.StreamSeq, "step", what, "err", err)
		n := 1
		if md, merr := adv.Metadata(); merr == nil {
			n = int(md.NumDelivered)
		}
		_ = adv.NakWithDelay(c.cfg.Nak.Delay(n))
	}
	var raw *jetstream.RawStreamMsg
	s, err := c.js.Stream(ctx, c.cfg.Stream)
	if err == nil {
		raw, err = s.GetMsg(ctx, a.StreamSeq)
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// The stream's state now, not before the read: the message may
		// have aged out in between.
		var info *jetstream.StreamInfo
		if info, err = s.Info(ctx); err != nil {
			retry("stream info", err)
			return
		}
		c.rescueGone(ctx, adv, info, a, retry)
		return
	}
	if err != nil {
		retry("read message", err)
		return
	}
	im := inbox.Message{ID: raw.Header.Get(jetstream.MsgIDHeader), Payload: raw.Data, Subject: raw.Subject,
		StreamSeq: a.StreamSeq, Deliveries: a.Deliveries, Final: true}
	out, err := c.proc.Process(ctx, []inbox.Message{im})
	var crash *hook.Crash
	if errors.As(err, &crash) {
		onCrash(err) // a dead process settles nothing
		return
	}
	src := rescued{raw: raw, adv: adv}
	switch o := out[0]; {
	case o.Ackable():
		c.rescued.Add(1)
		c.cfg.logger.Info("jsinbox: rescued a message after max deliveries", "id", im.ID, "stream_seq", im.StreamSeq, "status", o.Status)
		_ = adv.Ack()
	case o.Status == inbox.StatusRejected || o.Status == inbox.StatusConflict:
		if c.settleRejected(ctx, src, &im, o) {
			c.rescued.Add(1)
		}
	default:
		retry("inbox", err)
	}
}

// DeadLetterExpired is the [HeaderStatus] of the record a rescue leaves in
// the dead-letter stream for a message the server gave up on that aged
// out of the intents stream (max_age) before it could be rescued: the
// intent's fate is unknown, and nothing is kept to re-drive. The record
// has no payload and no [HeaderMessageID] (the message, and with it its
// ID, is gone); verify counts it as a violation of its own kind.
const DeadLetterExpired = "expired"

// expiredToken stands for the wildcards of the intents stream's subject
// in the subject of an expired record.
const expiredToken = "_expired_"

// expiredSubject is the subject of the expired records of an intents
// stream whose first subject is filter: under [DeadLetterPrefix], so the
// dead-letter stream captures it, with each wildcard token replaced by a
// fixed one. Its length does not depend on any producer.
func expiredSubject(filter string) string {
	toks := strings.Split(filter, ".")
	for i, t := range toks {
		if t == "*" || t == ">" {
			toks[i] = expiredToken
		}
	}
	return DeadLetterPrefix + strings.Join(toks, ".")
}

// rescueGone settles an advisory whose message the stream no longer holds.
// Up to the stream's last sequence, the message is gone (aged out, as the
// stream denies deletes) before the rescue: the expired record is
// published to the dead-letter stream (with an ID like a dead letter's, so
// a retry stores it once) and counted, then the advisory is acked; a
// failed publish naks the advisory to try again. Beyond it, the stream
// never held the message: the advisory names no message of this stream,
// and it is terminated like a forged one.
func (c *Consumer) rescueGone(ctx context.Context, adv jetstream.Msg, info *jetstream.StreamInfo, a maxDeliverAdvisory, retry func(string, error)) {
	if a.StreamSeq > info.State.LastSeq {
		c.foreignAdvisories.Add(1)
		c.cfg.logger.Error("jsinbox: a max-deliveries advisory names a message this stream never held; terminated, nothing rescued",
			"stream", c.cfg.Stream, "stream_seq", a.StreamSeq, "first_seq", info.State.FirstSeq, "last_seq", info.State.LastSeq)
		_ = adv.Term()
		return
	}
	subject := DeadLetterPrefix + expiredToken
	if len(info.Config.Subjects) > 0 {
		subject = expiredSubject(info.Config.Subjects[0])
	}
	seq := strconv.FormatUint(a.StreamSeq, 10)
	reason := fmt.Sprintf("given up on after %d deliveries, then gone from %s (max_age %s) before it was rescued; its fate is unknown",
		a.Deliveries, c.cfg.Stream, info.Config.MaxAge)
	rec := &nats.Msg{Subject: subject, Header: nats.Header{
		HeaderStatus:    []string{DeadLetterExpired},
		HeaderReason:    []string{reason},
		HeaderScope:     []string{c.proc.Scope()},
		HeaderStream:    []string{c.cfg.Stream},
		HeaderStreamSeq: []string{seq},
		HeaderDelivered: []string{strconv.FormatUint(a.Deliveries, 10)},
	}}
	if err := c.publishDeadLetter(ctx, rec, &inbox.Message{StreamSeq: a.StreamSeq}); err != nil {
		retry("record expired message", err)
		return
	}
	c.rescueExpired.Add(1)
	c.cfg.logger.Error("jsinbox: a message given up on after max deliveries aged out of the stream before its rescue; recorded in the dead-letter stream as expired",
		"stream", c.cfg.Stream, "stream_seq", a.StreamSeq, "deliveries", a.Deliveries, "dead_letter_stream", DeadLetterStream(c.cfg.Stream))
	_ = adv.Ack()
}
