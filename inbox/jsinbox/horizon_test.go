package jsinbox_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

func TestComputeHorizon(t *testing.T) {
	t.Parallel()
	h, d, m, s := time.Hour, 24*time.Hour, time.Minute, time.Second
	stream := jetstream.StreamConfig{Name: "INTENTS", MaxAge: 7 * d, Duplicates: 2 * m}
	dlq := &jetstream.StreamConfig{Name: "INTENTS_DLQ", MaxAge: 30 * d}
	cases := []struct {
		name string
		in   jsinbox.HorizonInputs
		want time.Duration
	}{
		// R = 20 × (30s + 30s) = 20m < MaxAge: life is MaxAge.
		{"deploy defaults", jsinbox.HorizonInputs{Stream: stream, PublishRetry: m}, 2*m + 7*d},
		{"deploy defaults with re-drives", jsinbox.HorizonInputs{Stream: stream, DeadLetters: dlq, PublishRetry: m}, 2*m + 7*d + 30*d + 7*d},
		// A producer retrying past the duplicate window lands late copies.
		{"long producer retries", jsinbox.HorizonInputs{Stream: stream, PublishRetry: 10 * m}, 10*m + 7*d},
		// R = 200 × (30s + 30s) = 3h20m > MaxAge 1h.
		{"redeliveries outlast MaxAge", jsinbox.HorizonInputs{Stream: jetstream.StreamConfig{MaxAge: h, Duplicates: 2 * m},
			Consumer: &jetstream.ConsumerConfig{AckWait: 30 * s, MaxDeliver: 200}, PublishRetry: m}, 2*m + 3*h + 20*m},
		// The last BackOff step replaces AckWait when longer; the nak cap adds.
		{"backoff and nak cap", jsinbox.HorizonInputs{Stream: jetstream.StreamConfig{MaxAge: m, Duplicates: 2 * m},
			Consumer: &jetstream.ConsumerConfig{AckWait: 30 * s, MaxDeliver: 10, BackOff: []time.Duration{s, 5 * m}}, NakCap: m, PublishRetry: m}, 2*m + 10*(5*m+m)},
		{"saturates", jsinbox.HorizonInputs{Stream: jetstream.StreamConfig{MaxAge: math.MaxInt64 / 2, Duplicates: m}, DeadLetters: &jetstream.StreamConfig{MaxAge: math.MaxInt64 / 2}}, math.MaxInt64},
	}
	for _, c := range cases {
		got, err := jsinbox.ComputeHorizon(c.in)
		if err != nil || got.Total != c.want {
			t.Errorf("%s: %v (%s), %v; want %v", c.name, got.Total, got.Why, err, c.want)
		}
	}
	for name, in := range map[string]jsinbox.HorizonInputs{
		"stream forever":       {Stream: jetstream.StreamConfig{Duplicates: m}},
		"dead letters forever": {Stream: stream, DeadLetters: &jetstream.StreamConfig{Name: "INTENTS_DLQ"}},
		"unlimited deliveries": {Stream: stream, Consumer: &jetstream.ConsumerConfig{Durable: "ledger", MaxDeliver: -1}},
	} {
		if _, err := jsinbox.ComputeHorizon(in); !errors.Is(err, jsinbox.ErrUnboundedHorizon) {
			t.Errorf("%s: %v, want ErrUnboundedHorizon", name, err)
		}
	}
	got, _ := jsinbox.ComputeHorizon(jsinbox.HorizonInputs{Stream: stream, DeadLetters: dlq})
	for _, want := range []string{"duplicate window 2m0s", "MaxAge 168h0m0s", "the consumer's defaults MaxDeliver 20", "INTENTS_DLQ MaxAge 720h0m0s"} {
		if !strings.Contains(got.Why, want) {
			t.Errorf("Why lacks %q: %s", want, got.Why)
		}
	}
}

// TestHorizonDefaultsAreTheConsumers: the horizon assumes, for a durable
// that does not exist yet, what a Consumer would create it with.
func TestHorizonDefaultsAreTheConsumers(t *testing.T) {
	t.Parallel()
	c := jsinbox.ConsumerConfig{}.WithDefaults()
	if c.AckWait != jsinbox.DefaultAckWait || c.MaxDeliver != jsinbox.DefaultMaxDeliver || c.Nak.Cap != jsinbox.DefaultNakCap {
		t.Errorf("ConsumerConfig defaults AckWait %v, MaxDeliver %d, nak cap %v; the horizon assumes %v, %d, %v",
			c.AckWait, c.MaxDeliver, c.Nak.Cap, jsinbox.DefaultAckWait, jsinbox.DefaultMaxDeliver, jsinbox.DefaultNakCap)
	}
	p := jsinbox.PublisherConfig{}.WithDefaults()
	if h, _ := p.Retry.Horizon(); h != jsinbox.DefaultPublishRetryHorizon() {
		t.Errorf("the publisher's default retry horizon is %v; the horizon assumes %v", h, jsinbox.DefaultPublishRetryHorizon())
	}
}
