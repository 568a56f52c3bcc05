package jscheck_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/jscheck"
)

func TestComputeHorizon(t *testing.T) {
	t.Parallel()
	h, d, m, s := time.Hour, 24*time.Hour, time.Minute, time.Second
	stream := jetstream.StreamConfig{Name: "INTENTS", MaxAge: 7 * d, Duplicates: 2 * m}
	dlq := &jetstream.StreamConfig{Name: "INTENTS_DLQ", MaxAge: 30 * d}
	cases := []struct {
		name string
		in   jscheck.HorizonInputs
		want time.Duration
	}{
		// R = 20 × (30s + 30s) = 20m < MaxAge: life is MaxAge.
		{"deploy defaults", jscheck.HorizonInputs{Stream: stream, PublishRetry: m}, 2*m + 7*d},
		{"deploy defaults with re-drives", jscheck.HorizonInputs{Stream: stream, DeadLetters: dlq, PublishRetry: m}, 2*m + 7*d + 30*d + 7*d},
		// A producer retrying past the duplicate window lands late copies.
		{"long producer retries", jscheck.HorizonInputs{Stream: stream, PublishRetry: 10 * m}, 10*m + 7*d},
		// R = 200 × (30s + 30s) = 3h20m > MaxAge 1h.
		{"redeliveries outlast MaxAge", jscheck.HorizonInputs{Stream: jetstream.StreamConfig{MaxAge: h, Duplicates: 2 * m},
			Consumer: &jetstream.ConsumerConfig{AckWait: 30 * s, MaxDeliver: 200}, PublishRetry: m}, 2*m + 3*h + 20*m},
		// The last BackOff step replaces AckWait when longer; the nak cap adds.
		{"backoff and nak cap", jscheck.HorizonInputs{Stream: jetstream.StreamConfig{MaxAge: m, Duplicates: 2 * m},
			Consumer: &jetstream.ConsumerConfig{AckWait: 30 * s, MaxDeliver: 10, BackOff: []time.Duration{s, 5 * m}}, NakCap: m, PublishRetry: m}, 2*m + 10*(5*m+m)},
		{"saturates", jscheck.HorizonInputs{Stream: jetstream.StreamConfig{MaxAge: math.MaxInt64 / 2, Duplicates: m}, DeadLetters: &jetstream.StreamConfig{MaxAge: math.MaxInt64 / 2}}, math.MaxInt64},
	}
	for _, c := range cases {
		got, err := jscheck.ComputeHorizon(c.in)
		if err != nil || got.Total != c.want {
			t.Errorf("%s: %v (%s), %v; want %v", c.name, got.Total, got.Why, err, c.want)
		}
	}
	for name, in := range map[string]jscheck.HorizonInputs{
		"stream forever":       {Stream: jetstream.StreamConfig{Duplicates: m}},
		"dead letters forever": {Stream: stream, DeadLetters: &jetstream.StreamConfig{Name: "INTENTS_DLQ"}},
		"unlimited deliveries": {Stream: stream, Consumer: &jetstream.ConsumerConfig{Durable: "ledger", MaxDeliver: -1}},
	} {
		if _, err := jscheck.ComputeHorizon(in); !errors.Is(err, jscheck.ErrUnboundedHorizon) {
			t.Errorf("%s: %v, want ErrUnboundedHorizon", name, err)
		}
	}
	got, _ := jscheck.ComputeHorizon(jscheck.HorizonInputs{Stream: stream, DeadLetters: dlq})
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
	if h, _ := p.Retry.Horizon(); h != jscheck.DefaultPublishRetryHorizon() {
		t.Errorf("the publisher's default retry horizon is %v; the horizon assumes %v", h, jscheck.DefaultPublishRetryHorizon())
	}
}

func TestCheckHorizons(t *testing.T) {
	t.Parallel()
	stream := jetstream.StreamConfig{Name: "INTENTS", MaxAge: 7 * 24 * time.Hour, Duplicates: 2 * time.Minute}
	cons := &jetstream.ConsumerConfig{Durable: "ledger", MaxDeliver: 20, AckWait: 30 * time.Second}
	cases := []struct {
		name   string
		stream jetstream.StreamConfig
		cons   *jetstream.ConsumerConfig
		h      jscheck.HorizonOptions
		want   string
	}{
		{"safe", stream, cons, jscheck.HorizonOptions{Retention: 30 * 24 * time.Hour}, ""},
		{"never pruned", stream, cons, jscheck.HorizonOptions{}, ""},
		{"retention below MaxAge", stream, cons, jscheck.HorizonOptions{Retention: 24 * time.Hour}, "MaxAge 168h0m0s is longer than the inbox retention"},
		{"unlimited MaxAge", jetstream.StreamConfig{Duplicates: 2 * time.Minute}, cons, jscheck.HorizonOptions{Retention: time.Hour}, "keeps messages forever"},
		{"unlimited MaxDeliver", stream, &jetstream.ConsumerConfig{Durable: "x", MaxDeliver: -1}, jscheck.HorizonOptions{}, "unlimited MaxDeliver"},
		{"redelivery past retention", jetstream.StreamConfig{MaxAge: time.Minute, Duplicates: 2 * time.Minute}, &jetstream.ConsumerConfig{MaxDeliver: 100, AckWait: time.Minute}, jscheck.HorizonOptions{Retention: time.Hour}, "longer than the inbox retention 1h0m0s"},
		{"short duplicate window", jetstream.StreamConfig{MaxAge: time.Hour, Duplicates: 10 * time.Second}, cons, jscheck.HorizonOptions{}, "duplicate window 10s is shorter"},
		// The horizon prune computes: 2m late copies + 7d, plus a 1h margin.
		{"retention at the horizon", stream, cons, jscheck.HorizonOptions{Retention: 7*24*time.Hour + 2*time.Minute + time.Hour}, "is not longer than the horizon 168h2m0s + margin 1h0m0s"},
		{"retention past the horizon", stream, cons, jscheck.HorizonOptions{Retention: 7*24*time.Hour + 2*time.Minute + time.Hour + time.Second}, ""},
		{"re-drives count", stream, cons, jscheck.HorizonOptions{Retention: 30 * 24 * time.Hour, DeadLetters: &jetstream.StreamConfig{Name: "INTENTS_DLQ", MaxAge: 30 * 24 * time.Hour}}, "re-drives"},
	}
	for _, c := range cases {
		got := strings.Join(jscheck.CheckHorizons(c.stream, c.cons, c.h), "\n")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}
