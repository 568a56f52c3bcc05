package jsinbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream defaults.
const (
	DefaultStream          = "INTENTS"
	DefaultSubject         = "intents.>"
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultMaxAge          = 7 * 24 * time.Hour
	DefaultMaxMsgs         = 50_000_000
	DefaultMaxBytes        = 16 << 30
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
		Duplicates:  o.DuplicateWindow,
		DenyDelete:  true,
		DenyPurge:   true,
		AllowRollup: false,
		AllowMsgTTL: false,
		// Lets the producer publish atomic batches: one fsync per batch
		// under sync_interval: always. It adds no way to delete or alter
		// stored intents.
		AllowAtomicPublish: true,
	}
}

// DeadLetterConfig returns the configuration of the dead-letter stream for an
// intents stream: same durability, subjects "dlq.<intent subject>".
func (o StreamConfig) DeadLetterConfig() jetstream.StreamConfig {
	c := o.Config()
	c.Name = DeadLetterStream(c.Name)
	c.Subjects = make([]string, len(o.WithDefaults().Subjects))
	for i, s := range o.WithDefaults().Subjects {
		c.Subjects[i] = DeadLetterPrefix + s
	}
	// Dead letters wait for a person, who deletes them once handled; a full
	// dead-letter stream would make every dead-letter publish fail.
	c.MaxAge = 30 * 24 * time.Hour
	c.DenyDelete, c.DenyPurge = false, false
	return c
}

// DeadLetterPrefix is put in front of an intent's subject to form its
// dead-letter subject.
const DeadLetterPrefix = "dlq."

// EnsureStream creates the stream, its dead-letter stream and its advisory
// stream (see [AdvisoryStream]), or checks that
// existing ones are safe: file storage, DiscardNew, deny delete and purge, no
// rollup or per-message TTL headers, and a duplicate window at least as long
// as asked. It never changes an existing stream; it returns an error naming
// every unsafe setting instead.
func EnsureStream(ctx context.Context, js jetstream.JetStream, o StreamConfig) (jetstream.Stream, error) {
	o = o.WithDefaults()
	if _, err := ensure(ctx, js, o.DeadLetterConfig(), checkDeadLetter); err != nil {
		return nil, err
	}
	if _, err := ensure(ctx, js, o.AdvisoryConfig(), checkAdvisory); err != nil {
		return nil, err
	}
	return ensure(ctx, js, o.Config(), func(c jetstream.StreamConfig) []string { return CheckStream(c, o.DuplicateWindow) })
}

func ensure(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, check func(jetstream.StreamConfig) []string) (jetstream.Stream, error) {
	// Look first: in production the operator creates the streams and a
	// producer may only read their info.
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, cfg.Name) // created by a concurrent starter
		} else if err == nil {
			return s, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("jsinbox: stream %s: %w", cfg.Name, err)
	}
	if problems := check(s.CachedInfo().Config); len(problems) > 0 {
		return nil, fmt.Errorf("jsinbox: existing stream %s is unsafe: %s", cfg.Name, strings.Join(problems, "; "))
	}
	return s, nil
}
