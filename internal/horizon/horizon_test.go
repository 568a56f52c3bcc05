package horizon_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/horizon"
)

func TestCompute(t *testing.T) {
	t.Parallel()
	h, d, m, s := time.Hour, 24*time.Hour, time.Minute, time.Second
	stream := jetstream.StreamConfig{Name: "INTENTS", MaxAge: 7 * d, Duplicates: 2 * m}
	dlq := &jetstream.StreamConfig{Name: "INTENTS_DLQ", MaxAge: 30 * d}
	cases := []struct {
		name string
		in   horizon.Inputs
		want time.Duration
	}{
		// R = 20 × (30s + 30s) = 20m < MaxAge: life is MaxAge.
		{"deploy defaults", horizon.Inputs{Stream: stream, PublishRetry: m}, 2*m + 7*d},
		{"deploy defaults with re-drives", horizon.Inputs{Stream: stream, DeadLetters: dlq, PublishRetry: m}, 2*m + 7*d + 30*d + 7*d},
		// A producer retrying past the duplicate window lands late copies.
		{"long producer retries", horizon.Inputs{Stream: stream, PublishRetry: 10 * m}, 10*m + 7*d},
		// R = 200 × (30s + 30s) = 3h20m > MaxAge 1h.
		{"redeliveries outlast MaxAge", horizon.Inputs{Stream: jetstream.StreamConfig{MaxAge: h, Duplicates: 2 * m},
			Consumer: &jetstream.ConsumerConfig{AckWait: 30 * s, MaxDeliver: 200}, PublishRetry: m}, 2*m + 3*h + 20*m},
		// The last BackOff step replaces AckWait when longer; the nak cap adds.
		{"backoff and nak cap", horizon.Inputs{Stream: jetstream.StreamConfig{MaxAge: m, Duplicates: 2 * m},
			Consumer: &jetstream.ConsumerConfig{AckWait: 30 * s, MaxDeliver: 10, BackOff: []time.Duration{s, 5 * m}}, NakCap: m, PublishRetry: m}, 2*m + 10*(5*m+m)},
		{"saturates", horizon.Inputs{Stream: jetstream.StreamConfig{MaxAge: math.MaxInt64 / 2, Duplicates: m}, DeadLetters: &jetstream.StreamConfig{MaxAge: math.MaxInt64 / 2}}, math.MaxInt64},
	}
	for _, c := range cases {
		got, err := horizon.Compute(c.in)
		if err != nil || got.Total != c.want {
			t.Errorf("%s: %v (%s), %v; want %v", c.name, got.Total, got.Why, err, c.want)
		}
	}
	for name, in := range map[string]horizon.Inputs{
		"stream forever":       {Stream: jetstream.StreamConfig{Duplicates: m}},
		"dead letters forever": {Stream: stream, DeadLetters: &jetstream.StreamConfig{Name: "INTENTS_DLQ"}},
		"unlimited deliveries": {Stream: stream, Consumer: &jetstream.ConsumerConfig{Durable: "ledger", MaxDeliver: -1}},
	} {
		if _, err := horizon.Compute(in); !errors.Is(err, horizon.ErrUnbounded) {
			t.Errorf("%s: %v, want ErrUnbounded", name, err)
		}
	}
	got, _ := horizon.Compute(horizon.Inputs{Stream: stream, DeadLetters: dlq})
	for _, want := range []string{"duplicate window 2m0s", "MaxAge 168h0m0s", "the consumer's defaults MaxDeliver 20", "INTENTS_DLQ MaxAge 720h0m0s"} {
		if !strings.Contains(got.Why, want) {
			t.Errorf("Why lacks %q: %s", want, got.Why)
		}
	}
}
