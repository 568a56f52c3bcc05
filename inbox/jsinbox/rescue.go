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
// runs, in batches: the messages are read back from the intents stream
// and settled through the processor in one transaction, each applied once
// or dead-lettered with a reason.

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
		// verify reads the advisories the rescue has not settled yet with
		// direct gets, as it reads every stream: their messages await
		// rescue, they are not lost.
		AllowDirect: true,
	}
}

// bindRescue finds (or creates) the advisory stream and the durable's
// consumer on it. The consumer has the durable's name and reads only that
// durable's advisories; it never gives up (a rescue that fails for a
// passing reason is naked and tried again).
func (c *Consumer) bindRescue(ctx context.Context) (jetstream.Consumer, error) {
	name := AdvisoryStream(c.cfg.Stream)
	s, err := c.stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		var intents jetstream.Stream
		if intents, err = c.stream(ctx, c.cfg.Stream); err == nil {
			s, err = withAPI(ctx, func(ctx context.Context) (jetstream.Stream, error) {
				return c.js.CreateStream(ctx, advisoryConfig(intents.CachedInfo().Config))
			})
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				s, err = c.stream(ctx, name)
			}
		}
	}
	if err != nil {
		return nil, setupError(fmt.Errorf("jsinbox: advisory stream %s, which keeps the max-deliveries advisories a consumer rescues messages from, could not be found or created: "+
			"create it with jsinbox.EnsureStream (`jetinbox producer` calls it), or nats stream add %s --config deploy/jetstream/advisories-stream.json: %w", name, name, err))
	}
	if problems := checkAdvisory(s.CachedInfo().Config); len(problems) > 0 {
		return nil, &SetupError{Err: fmt.Errorf("jsinbox: existing stream %s is unsafe: %v", name, problems)}
	}
	cons, err := withAPI(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return s.Consumer(ctx, c.cfg.Durable) })
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cctx, cancel := apiCtx(ctx)
		defer cancel()
		cons, err = s.CreateConsumer(cctx, jetstream.ConsumerConfig{
			Durable:       c.cfg.Durable,
			FilterSubject: maxDeliveriesSubject(c.cfg.Stream, c.cfg.Durable),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       c.cfg.AckWait,
			MaxDeliver:    -1,
			MaxAckPending: RescueMaxAckPending,
		})
		if errors.Is(err, jetstream.ErrConsumerExists) {
			cons, err = withAPI(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return s.Consumer(ctx, c.cfg.Durable) })
		}
	}
	if err != nil {
		return nil, setupError(fmt.Errorf("jsinbox: rescue consumer %s on %s (refused by the server: check the account's permissions, "+
			"or create it with nats consumer add %s --config deploy/jetstream/ledger-rescue-consumer.json): %w", c.cfg.Durable, name, name, err))
	}
	return cons, nil
}

// RescueBatch is how many max-deliveries advisories a rescue settles in
// one transaction at most: the messages they name are read back from the
// intents stream together (concurrent gets) and run through the
// processor as one batch, like the main path's.
const RescueBatch = 1000

// RescueMaxAckPending is the rescue durable's max_ack_pending as a
// consumer creates it: room for a full [RescueBatch] and the next pull. A
// durable made with less (64 before) still works, its rescue batches no
// larger than that.
const RescueMaxAckPending = 2048

// rescueReaders is how many reads of given-up messages a rescue batch has
// under way at once.
const rescueReaders = 32

// startRescue drains the durable's advisories, in batches of what has
// arrived (up to [RescueBatch]), until the returned stop is called; stop
// waits for a batch in progress. A simulated crash during a rescue is
// handed to onCrash.
func (c *Consumer) startRescue(ctx context.Context, cons jetstream.Consumer, onCrash func(error)) (stop func(), err error) {
	c.rescueBound.Store(&cons)
	in := make(chan jetstream.Msg, RescueBatch)
	quit := make(chan struct{})
	done := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case in <- m:
		case <-quit: // a stopped consumer settles nothing
		}
	}, jetstream.PullMaxMessages(RescueBatch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		c.cfg.Logger.Debug("jsinbox: rescue consume", "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("jsinbox: consume advisories: %w", err)
	}
	go func() {
		defer close(done)
		batch := make([]jetstream.Msg, 0, RescueBatch)
		for {
			select {
			case <-quit:
				return
			case m := <-in:
				batch = append(batch[:0], m)
			}
			// What has arrived goes into the same batch; a short wait
			// lets a pull that is still arriving join it.
			linger := time.NewTimer(2 * time.Millisecond)
		gather:
			for len(batch) < RescueBatch {
				select {
				case m := <-in:
					batch = append(batch, m)
				case <-linger.C:
					break gather
				}
			}
			linger.Stop()
			select {
			case <-quit:
				return // stopped while gathering: settles nothing
			default:
			}
			if c.crashed.Load() {
				continue // a dead consumer settles nothing
			}
			c.rescueBatch(ctx, batch, onCrash)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cc.Stop()
			close(quit)
			<-done
		})
	}, nil
}

// RescueBacklog returns how many max-deliveries advisories of the durable
// are not settled yet, as the server counts them on the rescue durable:
// not yet delivered, or delivered and not acked. An advisory is settled
// once its message is applied (or found applied), dead-lettered, recorded
// as expired, or the advisory is refused as foreign; then it is acked.
// It needs a running consumer.
func (c *Consumer) RescueBacklog(ctx context.Context) (uint64, error) {
	b := c.rescueBound.Load()
	if b == nil {
		return 0, errors.New("jsinbox: consumer not running")
	}
	info, err := (*b).Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("jsinbox: rescue durable %s: %w", c.cfg.Durable, err)
	}
	return info.NumPending + uint64(info.NumAckPending), nil
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

// rescueOne is one genuine advisory of a rescue batch and the message it
// names, once read back.
type rescueOne struct {
	adv jetstream.Msg
	a   maxDeliverAdvisory
	raw *jetstream.RawStreamMsg
	err error // reading raw back
	i   int   // its message in the batch; -1 for none
}

// retryRescue naks an advisory whose rescue failed for a passing reason,
// to try again later.
func (c *Consumer) retryRescue(adv jetstream.Msg, seq uint64, what string, err error) {
	c.cfg.Logger.Warn("jsinbox: rescue after max deliveries failed; trying again later", "stream_seq", seq, "step", what, "err", err)
	n := 1
	if md, merr := adv.Metadata(); merr == nil {
		n = int(md.NumDelivered)
	}
	_ = adv.NakWithDelay(c.cfg.Nak.Delay(n))
}

// rescueBatch settles the messages a batch of advisories names: it reads
// them back from the stream (concurrent gets) and runs them through the
// inbox once more, in one transaction, as final deliveries, so each ends
// applied (or found applied) or dead-lettered with a reason. A database or
// stream that fails now naks the advisories, to try again later. A message
// that is not a genuine advisory is terminated and counted; one for a
// message that aged out of the stream first is recorded in the dead-letter
// stream (see [DeadLetterExpired]) before it is acked, and one whose
// read-back found nothing while the stream still holds it is tried again
// (see [Consumer.rescueGone]).
func (c *Consumer) rescueBatch(ctx context.Context, advs []jetstream.Msg, onCrash func(error)) {
	ones := make([]rescueOne, 0, len(advs))
	for _, adv := range advs {
		a, why := c.genuineAdvisory(adv)
		if why != "" {
			c.foreignAdvisories.Add(1)
			c.cfg.Logger.Error("jsinbox: a message in the advisory stream is no max-deliveries advisory of this durable; terminated, nothing rescued",
				"subject", adv.Subject(), "durable", c.cfg.Durable, "why", why)
			_ = adv.Term()
			continue
		}
		ones = append(ones, rescueOne{adv: adv, a: a, i: -1})
	}
	if len(ones) == 0 {
		return
	}
	s, err := c.stream(ctx, c.cfg.Stream)
	if err != nil {
		for _, o := range ones {
			c.retryRescue(o.adv, o.a.StreamSeq, "stream info", err)
		}
		return
	}
	c.readBack(ctx, s, ones)

	// One inbox message per sequence: two advisories of one message (a
	// redelivered advisory) share its outcome.
	msgs := make([]inbox.Message, 0, len(ones))
	bySeq := make(map[uint64]int, len(ones))
	var gone []int
	for k := range ones {
		o := &ones[k]
		switch {
		case errors.Is(o.err, jetstream.ErrMsgNotFound):
			gone = append(gone, k)
			continue
		case o.err != nil:
			c.retryRescue(o.adv, o.a.StreamSeq, "read message", o.err)
			continue
		}
		if i, ok := bySeq[o.a.StreamSeq]; ok {
			o.i = i
			continue
		}
		o.i = len(msgs)
		bySeq[o.a.StreamSeq] = o.i
		msgs = append(msgs, inbox.Message{ID: o.raw.Header.Get(jetstream.MsgIDHeader), Payload: o.raw.Data, Subject: o.raw.Subject,
			StreamSeq: o.a.StreamSeq, Deliveries: o.a.Deliveries, Final: true})
	}
	if len(gone) > 0 {
		// The stream's state now, not before the reads: a message may
		// have aged out in between.
		info, err := withAPI(ctx, func(ctx context.Context) (*jetstream.StreamInfo, error) { return s.Info(ctx) })
		for _, k := range gone {
			if err != nil {
				c.retryRescue(ones[k].adv, ones[k].a.StreamSeq, "stream info", err)
				continue
			}
			c.rescueGone(ctx, ones[k].adv, info, ones[k].a)
		}
	}
	if len(msgs) == 0 {
		return
	}
	out, err := c.proc.Process(ctx, msgs)
	var crash *hook.Crash
	if errors.As(err, &crash) {
		onCrash(err) // a dead process settles nothing
		return
	}
	// settled: per message, whether its first advisory settled it (a
	// second advisory of it follows that one).
	settled := make([]bool, len(msgs))
	first := make([]bool, len(msgs))
	var nRescued int
	for k := range ones {
		o := &ones[k]
		if o.i < 0 {
			continue
		}
		im := &msgs[o.i]
		if err != nil {
			c.retryRescue(o.adv, im.StreamSeq, "inbox", err)
			continue
		}
		if first[o.i] {
			// Another advisory of a message this batch settled already.
			if settled[o.i] {
				_ = o.adv.Ack()
			} else {
				c.retryRescue(o.adv, im.StreamSeq, "inbox", errors.New("not settled"))
			}
			continue
		}
		first[o.i] = true
		switch res := out[o.i]; {
		case res.Ackable():
			settled[o.i] = true
			nRescued++
			c.rescued.Add(1)
			c.cfg.Logger.Debug("jsinbox: rescued a message after max deliveries", "id", im.ID, "stream_seq", im.StreamSeq, "status", res.Status)
			_ = o.adv.Ack()
		case res.Status == inbox.StatusRejected || res.Status == inbox.StatusConflict:
			if c.settleRejected(ctx, rescued{raw: o.raw, adv: o.adv}, im, res) {
				settled[o.i] = true
				c.rescued.Add(1)
			}
		default:
			c.retryRescue(o.adv, im.StreamSeq, "inbox", fmt.Errorf("%s: %s", res.Status, res.Reason))
		}
	}
	if nRescued > 0 {
		c.cfg.Logger.Info("jsinbox: rescued messages after max deliveries", "applied_or_found_applied", nRescued, "batch", len(msgs))
	}
}

// readBack reads the messages ones name from the intents stream, up to
// rescueReaders at a time (a direct get where the stream allows them).
func (c *Consumer) readBack(ctx context.Context, s jetstream.Stream, ones []rescueOne) {
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(rescueReaders, len(ones)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				ones[k].raw, ones[k].err = s.GetMsg(rctx, ones[k].a.StreamSeq)
				cancel()
			}
		}()
	}
	for k := range ones {
		work <- k
	}
	close(work)
	wg.Wait()
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

// rescueGone settles an advisory whose message a read-back did not find,
// judged by the stream's state as its leader answers it (info, fetched
// after the read). Only below the stream's first sequence is the message
// gone before the rescue (aged out: the stream denies deletes, purges,
// rollups and per-subject discards, so it loses messages only from its
// front): the expired record is published to the dead-letter stream (with
// an ID like a dead letter's, so a retry stores it once) and counted, then
// the advisory is acked; a failed publish naks the advisory to try again.
// From the first sequence up to the last, the stream still holds the
// message, and the read was answered by a replica or a mirror behind the
// leader (a direct get goes to any of them): recording it expired would
// drop an intent that is there to apply, so the advisory is left
// unsettled, counted, and tried again after a jittered backoff. Beyond
// the last sequence, the stream never held the message: the advisory
// names no message of this stream, and it is terminated like a forged
// one.
func (c *Consumer) rescueGone(ctx context.Context, adv jetstream.Msg, info *jetstream.StreamInfo, a maxDeliverAdvisory) {
	if a.StreamSeq > info.State.LastSeq {
		c.foreignAdvisories.Add(1)
		c.cfg.Logger.Error("jsinbox: a max-deliveries advisory names a message this stream never held; terminated, nothing rescued",
			"stream", c.cfg.Stream, "stream_seq", a.StreamSeq, "first_seq", info.State.FirstSeq, "last_seq", info.State.LastSeq)
		_ = adv.Term()
		return
	}
	if a.StreamSeq >= info.State.FirstSeq {
		c.rescueStaleReads.Add(1)
		c.retryRescue(adv, a.StreamSeq, "read message", fmt.Errorf("%w, though %s holds sequences %d to %d: a replica or mirror behind the leader answered the read; not recorded as expired",
			jetstream.ErrMsgNotFound, c.cfg.Stream, info.State.FirstSeq, info.State.LastSeq))
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
		c.retryRescue(adv, a.StreamSeq, "record expired message", err)
		return
	}
	c.rescueExpired.Add(1)
	c.cfg.Logger.Error("jsinbox: a message given up on after max deliveries aged out of the stream before its rescue; recorded in the dead-letter stream as expired",
		"stream", c.cfg.Stream, "stream_seq", a.StreamSeq, "deliveries", a.Deliveries, "dead_letter_stream", DeadLetterStream(c.cfg.Stream))
	_ = adv.Ack()
}
