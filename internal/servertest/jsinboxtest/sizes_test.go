package jsinboxtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestStreamSizeLimits: the streams EnsureStream creates cap message sizes
// (8 KiB intents, dead letters that much plus the headroom) and deny
// deleting or purging dead letters; existing streams that break either are
// refused with the setting named.
func TestStreamSizeLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	connect := func() jetstream.JetStream {
		srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	js := connect()
	s, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := js.Stream(ctx, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	ic, dc := s.CachedInfo().Config, dlq.CachedInfo().Config
	if ic.MaxMsgSize != jsinbox.DefaultMaxMsgSize || dc.MaxMsgSize != jsinbox.DefaultMaxMsgSize+jsinbox.DeadLetterHeadroom || !dc.DenyDelete || !dc.DenyPurge {
		t.Fatalf("intents max_msg_size %d; dead letters max_msg_size %d, deny delete %v, purge %v", ic.MaxMsgSize, dc.MaxMsgSize, dc.DenyDelete, dc.DenyPurge)
	}
	if err := dlq.Purge(ctx); err == nil {
		t.Error("the dead-letter stream was purged")
	}

	for _, c := range []struct {
		name   string
		mutate func(intents, dlq *jetstream.StreamConfig)
		want   string
	}{
		{"dead letters too small", func(_, d *jetstream.StreamConfig) { d.MaxMsgSize = jsinbox.DefaultMaxMsgSize }, "cannot be dead-lettered"},
		{"intents unbounded", func(i, _ *jetstream.StreamConfig) { i.MaxMsgSize = -1 }, "no max_msg_size"},
		{"dead letters deletable", func(_, d *jetstream.StreamConfig) { d.DenyDelete = false }, "DenyDelete is off: single dead letters"},
		{"dead letters purgeable", func(_, d *jetstream.StreamConfig) { d.DenyPurge = false }, "DenyPurge is off: the dead letters"},
	} {
		t.Run(c.name, func(t *testing.T) {
			js := connect()
			cfg := jsinbox.StreamConfig{}
			i, d := cfg.Config(), cfg.DeadLetterConfig()
			c.mutate(&i, &d)
			for _, sc := range []jetstream.StreamConfig{i, d, cfg.AdvisoryConfig()} {
				if _, err := js.CreateStream(ctx, sc); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := jsinbox.EnsureStream(ctx, js, cfg); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("EnsureStream: %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// TestLargestIntentDeadLettered: an intent of exactly the stream's
// max_msg_size, with the longest ID, rejected under the longest scope with
// a reason longer than any kept, still fits the dead-letter stream:
// DeadLetterHeadroom covers every header the copy adds.
func TestLargestIntentDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "", jsinbox.StreamConfig{})
	id := strings.Repeat("i", inbox.MaxIDLen)
	m := &nats.Msg{Subject: "intents.x", Header: nats.Header{jetstream.MsgIDHeader: {id}, "X-Producer": {"kept"}}}
	hdr := len("NATS/1.0\r\n") + len(jetstream.MsgIDHeader) + 2 + len(id) + 2 + len("X-Producer: kept\r\n") + 2
	m.Data = []byte(strings.Repeat("x", jsinbox.DefaultMaxMsgSize-hdr))
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		t.Fatalf("an intent of exactly %d bytes: %v", jsinbox.DefaultMaxMsgSize, err)
	}
	m.Data = append(m.Data, 'x')
	m.Header.Set(jetstream.MsgIDHeader, id[1:]+"j")
	if _, err := e.js.PublishMsg(ctx, m); !errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
		t.Fatalf("one byte more: %v, want refused", err)
	}
	scope := strings.Repeat("s", inbox.MaxIDLen)
	proc, err := inbox.NewProcessor(pginbox.New(e.pool), inbox.HandlerFunc(func(context.Context, pgx.Tx, inbox.Message) error {
		return inbox.Permanent(errors.New(strings.Repeat("a long reason ", 1000)))
	}), inbox.Config{Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	c, err := jsinbox.NewConsumer(e.js, proc, jsinbox.ConsumerConfig{Durable: "largest", MaxDeliver: 1})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	defer func() { stop(); <-done }()
	waitFor(t, 30*time.Second, func() bool { return c.Stats().DeadLettered == 1 })
	if s := c.Stats(); s.DeadLettersHeld != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestConsumerRefusesSizesItCannotHold: a dead-letter stream too small for
// the largest intent, or a MaxBytes that cannot hold a few of the largest
// messages, stop Run at start with a SetupError that names the setting.
func TestConsumerRefusesSizesItCannotHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		dlqSize  int32
		maxBytes int64
		want     string
	}{
		{"dead letters too small", jsinbox.DefaultMaxMsgSize, 0, "cannot be dead-lettered"},
		{"budget too small", 0, 4 * jsinbox.DefaultMaxMsgSize, "MaxBytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "", jsinbox.StreamConfig{})
			if c.dlqSize != 0 {
				dl, err := e.js.Stream(ctx, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
				if err != nil {
					t.Fatal(err)
				}
				cfg := dl.CachedInfo().Config
				cfg.MaxMsgSize = c.dlqSize
				if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
					t.Fatal(err)
				}
			}
			proc, err := inbox.NewProcessor(pginbox.New(e.pool), inbox.HandlerFunc(func(context.Context, pgx.Tx, inbox.Message) error { return nil }), inbox.Config{Scope: "ledger"})
			if err != nil {
				t.Fatal(err)
			}
			cons, err := jsinbox.NewConsumer(e.js, proc, jsinbox.ConsumerConfig{MaxBytes: c.maxBytes})
			if err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			err = cons.Run(rctx)
			var setup *jsinbox.SetupError
			if !errors.As(err, &setup) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Run: %v, want a SetupError saying %q", err, c.want)
			}
		})
	}
}
