package shard

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// StreamConfig returns the sharded stream's settings: jsinbox's intents
// stream on "<subject>.*.>", with the transform that inserts the partition.
// Only subjects with a key token and a kind are captured, so a publish
// that lacks them fails at the producer instead of being stored where no
// partition durable looks.
func (m *Map) StreamConfig(base jsinbox.StreamConfig) (jsinbox.StreamConfig, jetstream.StreamConfig) {
	base.Name = m.Stream
	base.Subjects = []string{m.Subject + ".*.>"}
	base = base.WithDefaults()
	cfg := base.Config()
	src, dest := m.SubjectTransform()
	cfg.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dest}
	return base, cfg
}

// EnsureStream creates the sharded stream with its transform if it is
// missing, then its dead-letter and advisory streams (jsinbox.EnsureStream),
// and refuses an existing stream whose transform is not the map's: its
// partitions would not be the ones the consumers check.
func (m *Map) EnsureStream(ctx context.Context, js jetstream.JetStream, base jsinbox.StreamConfig) error {
	o, cfg := m.StreamConfig(base)
	s, err := js.Stream(ctx, m.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, m.Stream)
		}
	}
	if err != nil {
		return fmt.Errorf("shard: stream %s: %w", m.Stream, err)
	}
	if err := m.CheckStream(s.CachedInfo().Config); err != nil {
		return err
	}
	if _, err := jsinbox.EnsureStream(ctx, js, o); err != nil {
		return fmt.Errorf("shard: %w", err)
	}
	return nil
}

// CheckStream reports a stream whose transform differs from the map's.
func (m *Map) CheckStream(cfg jetstream.StreamConfig) error {
	src, dest := m.SubjectTransform()
	t := cfg.SubjectTransform
	if t == nil || t.Source != src || t.Destination != dest {
		got := "none"
		if t != nil {
			got = fmt.Sprintf("%q → %q", t.Source, t.Destination)
		}
		return fmt.Errorf("shard: stream %s has subject transform %s, want %q → %q: its partitions are not the map's", m.Stream, got, src, dest)
	}
	return nil
}
