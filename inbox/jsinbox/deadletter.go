package jsinbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
)

// Headers the consumer adds to a dead-letter message. The original's own
// headers are kept, except JetStream's (Nats-*): they describe how the
// original was published, not the intent.
const (
	HeaderReason    = "Jetinbox-Reason"
	HeaderStatus    = "Jetinbox-Status"
	HeaderScope     = "Jetinbox-Scope"
	HeaderStream    = "Jetinbox-Stream"
	HeaderStreamSeq = "Jetinbox-Stream-Seq"
	HeaderDelivered = "Jetinbox-Deliveries"
	HeaderMessageID = "Jetinbox-Message-Id"
	// HeaderSubject is the original's subject, when it is at most
	// [inbox.MaxSubjectLen] bytes; a longer one (an intent rejected for it)
	// is cut there and HeaderSubjectSHA256 is set.
	HeaderSubject = "Jetinbox-Subject"
	// HeaderSubjectSHA256 is the hex SHA-256 of an original subject longer
	// than [inbox.MaxSubjectLen], which is kept neither in the dead letter's
	// subject nor in [HeaderSubject].
	HeaderSubjectSHA256 = "Jetinbox-Subject-Sha256"
)

// longSubjectKeep is how much of an over-long subject a dead letter's
// subject keeps, in bytes, before a token naming the rest by its hash.
const longSubjectKeep = 128

// DeadLetterSubject returns the subject the dead letter of a message on
// subject is published to: [DeadLetterPrefix] and subject. A subject longer
// than [inbox.MaxSubjectLen] (rejected for it) keeps its leading tokens up
// to longSubjectKeep bytes and names the rest by a hash token, so that no
// producer-chosen subject can make the dead-letter publish exceed the
// server's control-line limit (the server answers a too-long line by
// closing the connection, which nats.go does not reopen). The short form
// stays under the dead-letter stream's subjects as long as the intents
// stream's subjects are of the form "prefix.>".
func DeadLetterSubject(subject string) string {
	if len(subject) <= inbox.MaxSubjectLen {
		return DeadLetterPrefix + subject
	}
	sum := sha256.Sum256([]byte(subject))
	keep := ""
	if i := strings.LastIndexByte(subject[:longSubjectKeep], '.'); i > 0 {
		keep = subject[:i+1]
	}
	return DeadLetterPrefix + keep + "_long_" + hex.EncodeToString(sum[:12])
}

// OriginalSubject returns the subject of the intent a dead letter holds,
// and false if it was too long to keep (such an intent was rejected for its
// subject and cannot be published again as it was).
func OriginalSubject(dl *nats.Msg) (string, bool) {
	if dl.Header.Get(HeaderSubjectSHA256) != "" {
		return "", false
	}
	if s := dl.Header.Get(HeaderSubject); s != "" {
		return s, true
	}
	// Dead letters from before HeaderSubject: the subject carries it.
	return strings.TrimPrefix(dl.Subject, DeadLetterPrefix), true
}

// cut returns s cut to at most n bytes, on a rune boundary: a subject the
// inbox refused for its length is echoed in a header only within the
// dead-letter stream's room for headers.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// DeadLetterStream returns the name of the dead-letter stream of an intents
// stream.
func DeadLetterStream(stream string) string { return stream + "_DLQ" }

// settleable is what dead-lettering needs of a message: a jetstream.Msg, or
// a message read back from the stream after the server gave up on it.
type settleable interface {
	Headers() nats.Header
	Subject() string
	Data() []byte
	InProgress() error
	NakWithDelay(time.Duration) error
	TermWithReason(string) error
}

// deadLetterCopy builds the dead-letter message for m: its subject under
// [DeadLetterPrefix] (bounded, see [DeadLetterSubject]), its payload, its headers without JetStream's own, and
// the reason and the original's place in jetinbox's headers.
//
// No Jetinbox-* header of the original is copied: those are the consumer's
// to set, and a producer's own would pass for them. No Nats-* header is
// copied either: an atomic batch's Nats-Batch-* headers make
// the dead-letter stream refuse the copy as an incomplete batch, a
// producer's Nats-Expected-* headers name the intents stream, and
// Nats-Msg-Id, Nats-TTL or Nats-Rollup would make the copy a duplicate,
// expire it or delete others. The original ID travels as
// [HeaderMessageID].
func (c *Consumer) deadLetterCopy(m settleable, im *inbox.Message, status, reason string) *nats.Msg {
	src := m.Headers()
	h := make(nats.Header, len(src)+9)
	for k, v := range src {
		if len(k) >= 5 && strings.EqualFold(k[:5], "nats-") || len(k) >= 9 && strings.EqualFold(k[:9], "jetinbox-") {
			continue
		}
		h[k] = append([]string(nil), v...)
	}
	// One bounded line: a header cannot hold a newline, and a stack or a
	// dump belongs in the log.
	h.Set(HeaderReason, inbox.SanitizeReason(reason))
	h.Set(HeaderStatus, status)
	h.Set(HeaderScope, c.proc.Scope())
	h.Set(HeaderStream, c.cfg.Stream)
	h.Set(HeaderStreamSeq, strconv.FormatUint(im.StreamSeq, 10))
	h.Set(HeaderDelivered, strconv.FormatUint(im.Deliveries, 10))
	// Whole, however long: it takes the place of the original's
	// Nats-Msg-Id, which the intents stream's max_msg_size bounded.
	h.Set(HeaderMessageID, im.ID)
	subject := m.Subject()
	if len(subject) <= inbox.MaxSubjectLen {
		h.Set(HeaderSubject, subject)
	} else {
		sum := sha256.Sum256([]byte(subject))
		h.Set(HeaderSubject, cut(subject, longSubjectKeep))
		h.Set(HeaderSubjectSHA256, hex.EncodeToString(sum[:]))
	}
	return &nats.Msg{Subject: DeadLetterSubject(subject), Data: m.Data(), Header: h}
}

// publishDeadLetter publishes dl once, pinned to the dead-letter stream (a
// stream that captures the subject by mistake cannot take it), with an ID
// made of scope, stream and sequence, so that publishing the same dead
// letter again inside the dead-letter stream's duplicate window stores it
// once.
func (c *Consumer) publishDeadLetter(ctx context.Context, dl *nats.Msg, im *inbox.Message) error {
	id := c.proc.Scope() + ":" + c.cfg.Stream + ":" + strconv.FormatUint(im.StreamSeq, 10)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.js.PublishMsg(pctx, dl, jetstream.WithMsgID(id), jetstream.WithExpectStream(DeadLetterStream(c.cfg.Stream)))
	return err
}

// deadLetter publishes the dead-letter copy of m, waits for the dead-letter
// stream to store it, then terminates m. It reports whether m was
// dead-lettered.
//
// If the publish fails and m can come back (not its final delivery), m is
// naked with a jittered delay and dead-lettered on a later delivery. On the
// final delivery nothing would bring it back, so the consumer holds m
// (InProgress) and publishes again with the DeadLetterRetry policy, for as
// long as it takes, while [Consumer.Ready] reports false and
// [ConsumerStats.DeadLettersHeld] counts it. Only a consumer that stops
// lets go: the server then gives up on m after AckWait, and its
// max-deliveries advisory, kept in the advisory stream, makes the next
// consumer rescue it.
func (c *Consumer) deadLetter(ctx context.Context, m settleable, im *inbox.Message, status, reason string) bool {
	dl := c.deadLetterCopy(m, im, status, reason)
	err := c.publishDeadLetter(ctx, dl, im)
	if err != nil && !im.Final {
		c.cfg.Logger.Error("jsinbox: dead-letter publish failed; naking", "id", im.ID, "stream_seq", im.StreamSeq, "deliveries", im.Deliveries, "err", err)
		c.naks.Add(1)
		_ = m.NakWithDelay(c.cfg.Nak.Delay(int(max(im.Deliveries, 1))))
		return false
	}
	if err != nil {
		err = c.holdForDeadLetter(ctx, m, dl, im, err)
	}
	if err != nil {
		c.cfg.Logger.Error("jsinbox: stopping with a message the dead-letter stream did not take; the next consumer rescues it from its max-deliveries advisory",
			"id", im.ID, "stream_seq", im.StreamSeq, "deliveries", im.Deliveries, "err", err)
		return false
	}
	c.deadLettered.Add(1)
	c.dlLog.warn(c.cfg.Logger, reason, "id", im.ID, "stream_seq", im.StreamSeq, "deliveries", im.Deliveries, "status", status)
	_ = m.TermWithReason(cut(inbox.SanitizeReason(reason), 256))
	return true
}

// holdForDeadLetter keeps m (InProgress at least every AckWait/2) and
// publishes dl again with the DeadLetterRetry policy until the dead-letter
// stream takes it (nil) or the consumer stops (the last error).
func (c *Consumer) holdForDeadLetter(ctx context.Context, m settleable, dl *nats.Msg, im *inbox.Message, err error) error {
	c.deadLettersHeld.Add(1)
	defer c.deadLettersHeld.Add(-1)
	c.cfg.Logger.Error("jsinbox: the dead-letter stream refused a message on its last delivery; holding it and retrying until it does",
		"id", im.ID, "stream_seq", im.StreamSeq, "deliveries", im.Deliveries, "dead_letter_stream", DeadLetterStream(c.cfg.Stream), "err", err)
	bo := c.cfg.DeadLetterRetry.NewBackOff()
	keep := max(c.cfg.AckWait/2, time.Millisecond)
	for attempt := 2; ; attempt++ {
		d := bo.NextBackOff()
		if d < 0 {
			d = c.cfg.DeadLetterRetry.WithDefaults().Cap
		}
		for d > 0 {
			_ = m.InProgress()
			step := min(d, keep)
			d -= step
			select {
			case <-c.stopping:
				return err
			case <-time.After(step):
			}
		}
		_ = m.InProgress()
		if err = c.publishDeadLetter(ctx, dl, im); err == nil {
			c.cfg.Logger.Info("jsinbox: the dead-letter stream took the held message", "id", im.ID, "stream_seq", im.StreamSeq, "attempts", attempt)
			return nil
		}
		c.cfg.Logger.Debug("jsinbox: dead-letter publish still failing", "id", im.ID, "stream_seq", im.StreamSeq, "attempt", attempt, "err", err)
	}
}

// repeatOfRejected reports whether o is a copy of an intent the inbox
// rejected for another stream message, which was dead-lettered then: a
// re-publish of the rejected ID, or a second copy in the stream.
func repeatOfRejected(o inbox.Outcome, im *inbox.Message) bool {
	return o.Status == inbox.StatusRejected && o.FirstSeq != 0 && im.StreamSeq != 0 && o.FirstSeq != im.StreamSeq
}

// settleRejected settles a rejected or conflicting message: dead-lettered
// and terminated, or, for a repeat of an intent rejected before (see
// [inbox.Outcome.FirstSeq]), terminated with no second dead letter: the
// first one stands for the intent.
func (c *Consumer) settleRejected(ctx context.Context, m settleable, im *inbox.Message, o inbox.Outcome) bool {
	if repeatOfRejected(o, im) {
		c.rejectedRepeats.Add(1)
		c.cfg.Logger.Debug("jsinbox: copy of an intent rejected before; terminated without a second dead letter",
			"id", im.ID, "stream_seq", im.StreamSeq, "first_seq", o.FirstSeq)
		_ = m.TermWithReason(fmt.Sprintf("rejected before at stream seq %d", o.FirstSeq))
		return true
	}
	if o.Status == inbox.StatusConflict {
		c.conflicts.Add(1)
	} else {
		c.rejected.Add(1)
	}
	return c.deadLetter(ctx, m, im, o.Status.String(), o.Reason)
}
