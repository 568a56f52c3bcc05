package jsinbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/jscheck"
)

// Stream defaults.
const (
	DefaultStream          = "INTENTS"
	DefaultSubject         = "intents.>"
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultMaxAge          = 7 * 24 * time.Hour
	DefaultMaxMsgs         = 50_000_000
	DefaultMaxBytes        = 16 << 30
	// The dead-letter stream's defaults: dead letters are rare, and a
	// full dead-letter stream makes the consumer hold the messages it
	// rejects until there is room.
	DefaultDeadLetterMaxMsgs  = 1_000_000
	DefaultDeadLetterMaxBytes = 1 << 30
	DefaultDeadLetterMaxAge   = 30 * 24 * time.Hour
	// DefaultMaxMsgSize is the intents stream's largest message, headers
	// included: room for a 4 KiB intent (the ledger's limit,
	// effects.MaxIntentSize) with its ID, trace and batch headers. The
	// server refuses a bigger publish, so no consumer ever holds one.
	DefaultMaxMsgSize = 8 << 10
	// DeadLetterHeadroom is what a dead-letter copy may add to an intent:
	// jetinbox's headers (reason at most [inbox.MaxReasonLen] bytes, status,
	// scope, stream, sequence, deliveries, subject cut at
	// [inbox.MaxSubjectLen] with its hash: under 2 KiB in all; the message
	// ID takes the place of the original's Nats-Msg-Id) and its own
	// Nats-Msg-Id and Nats-Expected-Stream. The dead-letter stream's
	// max_msg_size must be at least the intents stream's plus this, or the
	// largest intent could not be dead-lettered.
	DeadLetterHeadroom = 4 << 10
)

// StreamConfig describes the intents stream. Every limit is explicit: the
// stream discards NEW messages when full (the publisher sees an error and
// retries), never old unconsumed intents.
type StreamConfig struct {
	// Name of the stream. Default "INTENTS".
	Name string
	// Subjects the stream captures. Default ["intents.>"].
	Subjects []string
	// Replicas is the replication factor. Default 1; use 3 in production.
	Replicas int
	// MaxMsgs, MaxBytes and MaxAge bound the stream. Defaults 50 million
	// messages, 16 GiB, 7 days. MaxAge is part of the replay horizon the
	// inbox's retention must cover.
	MaxMsgs  int64
	MaxBytes int64
	MaxAge   time.Duration
	// DuplicateWindow is how long JetStream remembers Nats-Msg-Id values to
	// drop publish retries. It must cover the producer's retry horizon.
	// Default 2 minutes.
	DuplicateWindow time.Duration
	// MaxMsgSize is the largest message the stream accepts, headers
	// included; a bigger publish is refused. It bounds what a consumer
	// holds per message. Default [DefaultMaxMsgSize] (8 KiB).
	MaxMsgSize int32
	// DeadLetterMaxMsgSize is the dead-letter stream's largest message.
	// Default MaxMsgSize + [DeadLetterHeadroom]; less is refused.
	DeadLetterMaxMsgSize int32
	// DeadLetterMaxMsgs, DeadLetterMaxBytes and DeadLetterMaxAge bound the
	// dead-letter stream. Defaults 1 million messages, 1 GiB, 30 days.
	DeadLetterMaxMsgs  int64
	DeadLetterMaxBytes int64
	DeadLetterMaxAge   time.Duration
	// AllowFastBatches sets allow_batched on the stream (nats-server 2.14
	// and later): a publisher may then send fast batches, acknowledged by
	// flow control and one PubAck for everything up to a sequence. The
	// relay's fast mode needs it. It pays where the stream does not fsync
	// every write; under sync_interval: always the server syncs each
	// message of a fast batch on its own, and atomic batches (always
	// allowed) are faster. It adds no way to delete or alter stored
	// intents. Default false.
	AllowFastBatches bool
}

// WithDefaults returns o with defaults filled in.
func (o StreamConfig) WithDefaults() StreamConfig {
	if o.Name == "" {
		o.Name = DefaultStream
	}
	if len(o.Subjects) == 0 {
		o.Subjects = []string{DefaultSubject}
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.MaxMsgs == 0 {
		o.MaxMsgs = DefaultMaxMsgs
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxAge == 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.DuplicateWindow == 0 {
		o.DuplicateWindow = DefaultDuplicateWindow
	}
	if o.MaxMsgSize == 0 {
		o.MaxMsgSize = DefaultMaxMsgSize
	}
	if o.DeadLetterMaxMsgSize == 0 && o.MaxMsgSize > 0 {
		o.DeadLetterMaxMsgSize = o.MaxMsgSize + DeadLetterHeadroom
	}
	if o.DeadLetterMaxMsgs == 0 {
		o.DeadLetterMaxMsgs = DefaultDeadLetterMaxMsgs
	}
	if o.DeadLetterMaxBytes == 0 {
		o.DeadLetterMaxBytes = DefaultDeadLetterMaxBytes
	}
	if o.DeadLetterMaxAge == 0 {
		o.DeadLetterMaxAge = DefaultDeadLetterMaxAge
	}
	return o
}

// Config returns the JetStream configuration for these options.
func (o StreamConfig) Config() jetstream.StreamConfig {
	o = o.WithDefaults()
	return jetstream.StreamConfig{
		Name:        o.Name,
		Subjects:    o.Subjects,
		Storage:     jetstream.FileStorage,
		Replicas:    o.Replicas,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		MaxMsgs:     o.MaxMsgs,
		MaxBytes:    o.MaxBytes,
		MaxAge:      o.MaxAge,
		MaxMsgSize:  o.MaxMsgSize,
		Duplicates:  o.DuplicateWindow,
		DenyDelete:  true,
		DenyPurge:   true,
		AllowRollup: false,
		AllowMsgTTL: false,
		// Lets the producer publish atomic batches: one fsync per batch
		// under sync_interval: always. It adds no way to delete or alter
		// stored intents.
		AllowAtomicPublish: true,
		AllowBatchPublish:  o.AllowFastBatches,
		// jetinbox verify reads with direct gets (batches by sequence),
		// so its NATS user needs no permission to create consumers, which
		// could rewrite a durable or deliver the stream anywhere. It adds
		// no way to change stored messages. The dead-letter stream
		// inherits it.
		AllowDirect: true,
	}
}

// DeadLetterConfig returns the configuration of the dead-letter stream for an
// intents stream: same durability and protections, subjects
// "dlq.<intent subject>", its own limits. Dead letters are the record of
// what was rejected and why: they age out, they are not deleted.
func (o StreamConfig) DeadLetterConfig() jetstream.StreamConfig {
	o = o.WithDefaults()
	c := o.Config()
	c.Name = DeadLetterStream(c.Name)
	c.Subjects = make([]string, len(o.Subjects))
	for i, s := range o.Subjects {
		c.Subjects[i] = DeadLetterPrefix + s
	}
	c.MaxMsgs, c.MaxBytes, c.MaxAge = o.DeadLetterMaxMsgs, o.DeadLetterMaxBytes, o.DeadLetterMaxAge
	c.MaxMsgSize = o.DeadLetterMaxMsgSize
	c.AllowBatchPublish = false // dead letters are published one by one
	return c
}

// DeadLetterPrefix is put in front of an intent's subject to form its
// dead-letter subject.
const DeadLetterPrefix = "dlq."

// EnsureStream creates the stream, its dead-letter stream and its advisory
// stream (see [AdvisoryStream]), or checks that existing ones are safe: file
// storage, DiscardNew, deny delete and purge, no rollup or per-message TTL
// headers, a duplicate window at least as long as asked, and a dead-letter
// stream that takes the largest intent with its dead-letter headers
// (the dead-letter fit check). It never
// changes an existing stream; it returns an error naming every unsafe
// setting instead. Creation is all or nothing: if one stream cannot be
// created (no room on the servers, say), the ones this call created are
// deleted again.
func EnsureStream(ctx context.Context, js jetstream.JetStream, o StreamConfig) (s jetstream.Stream, err error) {
	o = o.WithDefaults()
	var created []string
	defer func() {
		if err == nil {
			return
		}
		dctx := context.WithoutCancel(ctx)
		for _, name := range created {
			if derr := js.DeleteStream(dctx, name); derr != nil {
				err = fmt.Errorf("%w (and the stream %s it created could not be deleted again: %v)", err, name, derr)
			}
		}
	}()
	var dlq jetstream.StreamConfig
	for _, e := range []struct {
		cfg   jetstream.StreamConfig
		check func(jetstream.StreamConfig) []string
	}{
		{o.DeadLetterConfig(), checkDeadLetter},
		{o.AdvisoryConfig(), checkAdvisory},
		{o.Config(), func(c jetstream.StreamConfig) []string { return CheckStream(c, o.DuplicateWindow) }},
	} {
		var made bool
		if s, made, err = ensure(ctx, js, e.cfg, e.check); err != nil {
			return nil, err
		}
		if made {
			created = append(created, e.cfg.Name)
		}
		if e.cfg.Name == DeadLetterStream(o.Name) {
			dlq = s.CachedInfo().Config
		}
	}
	if problems := jscheck.CheckDeadLetterFit(s.CachedInfo().Config, dlq, js.Conn().MaxPayload()); len(problems) > 0 {
		return nil, fmt.Errorf("jsinbox: streams %s and %s: %s", o.Name, dlq.Name, strings.Join(problems, "; "))
	}
	return s, nil
}

// ensure returns the stream cfg names, checked, after creating it if it
// was missing (made).
func ensure(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, check func(jetstream.StreamConfig) []string) (s jetstream.Stream, made bool, err error) {
	// Look first: in production the operator creates the streams and a
	// producer may only read their info.
	// Each request is bounded on its own (see apiTimeout): a reply lost
	// while an R3 stream's group elects its leader must not hold the caller
	// until its own deadline.
	get := func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, cfg.Name) }
	s, err = withAPI(ctx, get)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = withAPI(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.CreateStream(ctx, cfg) })
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = withAPI(ctx, get) // created by a concurrent starter
		} else if err == nil {
			return s, true, nil
		}
	}
	if err != nil {
		return nil, false, fmt.Errorf("jsinbox: stream %s: %w", cfg.Name, err)
	}
	if problems := check(s.CachedInfo().Config); len(problems) > 0 {
		return nil, false, fmt.Errorf("jsinbox: existing stream %s is unsafe: %s", cfg.Name, strings.Join(problems, "; "))
	}
	return s, false, nil
}
