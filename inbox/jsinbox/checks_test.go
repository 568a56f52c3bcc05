package jsinbox_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/jitter"
)

// goodConsumer and goodPublisher are timings the lints have nothing to say
// about.
func goodConsumer() jsinbox.ConsumerTiming {
	nak := jitter.Default()
	return jsinbox.ConsumerTiming{AckWait: 30 * time.Second, MaxDeliver: 10, NakDelay: &nak}
}

func goodPublisher() jsinbox.PublisherTiming {
	publish := jitter.Default()
	return jsinbox.PublisherTiming{PublishRetry: &publish, PublishTimeout: 2 * time.Second, DuplicateWindow: 2 * time.Minute}
}

// containsAll reports, as a test error, each of want that no warning in got
// contains.
func containsAll(t *testing.T, got, want []string) {
	t.Helper()
	for _, want := range want {
		found := false
		for _, w := range got {
			found = found || strings.Contains(w, want)
		}
		if !found {
			t.Errorf("no warning contains %q; got:\n%s", want, strings.Join(got, "\n"))
		}
	}
}

func TestLintClean(t *testing.T) {
	t.Parallel()
	if w := jsinbox.LintConsumer(goodConsumer()); len(w) != 0 {
		t.Errorf("LintConsumer(good) = %q; want none", w)
	}
	if w := jsinbox.LintPublisher(goodPublisher()); len(w) != 0 {
		t.Errorf("LintPublisher(good) = %q; want none", w)
	}
	// A long nak delay is fine: the server times it from the nak.
	c := goodConsumer()
	c.NakDelay = &jitter.Policy{Base: time.Minute, Cap: time.Hour}
	if w := jsinbox.LintConsumer(c); len(w) != 0 {
		t.Errorf("LintConsumer with nak Cap > AckWait = %q; want none", w)
	}
	// A producer that does not retry has nothing to outlast.
	if w := jsinbox.LintPublisher(jsinbox.PublisherTiming{DuplicateWindow: time.Second}); len(w) != 0 {
		t.Errorf("LintPublisher without retries = %q; want none", w)
	}
}

func TestLintConsumer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*jsinbox.ConsumerTiming)
		want   []string // each must be in one warning
	}{
		{"unlimited MaxDeliver", func(c *jsinbox.ConsumerTiming) { c.MaxDeliver = -1 }, []string{"MaxDeliver -1 means unlimited"}},
		{"zero MaxDeliver", func(c *jsinbox.ConsumerTiming) { c.MaxDeliver = 0 }, []string{"MaxDeliver 0 means unlimited"}},
		{"BackOff", func(c *jsinbox.ConsumerTiming) {
			c.BackOff = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}
			c.AckWait = time.Second
			c.NakDelay = nil
		}, []string{"same delays to everyone", "does not apply to Nak"}},
		{"BackOff longer than MaxDeliver", func(c *jsinbox.ConsumerTiming) {
			c.BackOff = []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
			c.MaxDeliver = 2
		}, []string{"fixed list", "server rejects a BackOff longer than MaxDeliver"}},
		{"AckWait replaced by BackOff", func(c *jsinbox.ConsumerTiming) { c.BackOff = []time.Duration{time.Second} },
			[]string{"AckWait 30s is replaced by BackOff[0] = 1s"}},
		{"BackOff stretches nak delays", func(c *jsinbox.ConsumerTiming) {
			c.BackOff = []time.Duration{time.Second, time.Minute}
			c.AckWait = time.Second
		}, []string{"each nak delay grows by up to 59s"}},
		{"bare Nak", func(c *jsinbox.ConsumerTiming) { c.BareNak = true }, []string{"bare Nak() asks for immediate redelivery"}},
		{"nak without jitter", func(c *jsinbox.ConsumerTiming) { c.NakDelay = &jitter.Policy{Kind: jitter.None} },
			[]string{"NakDelay uses no jitter"}},
		{"invalid nak policy", func(c *jsinbox.ConsumerTiming) {
			c.NakDelay = &jitter.Policy{Base: time.Second, Cap: time.Millisecond}
		}, []string{"NakDelay: jitter: invalid policy: Cap 1ms is below Base 1s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := goodConsumer()
			tt.change(&c)
			containsAll(t, jsinbox.LintConsumer(c), tt.want)
		})
	}
}

func TestLintPublisher(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*jsinbox.PublisherTiming)
		want   []string // each must be in one warning
	}{
		{"publish without jitter", func(p *jsinbox.PublisherTiming) {
			p.PublishRetry = &jitter.Policy{Kind: jitter.None, MaxAttempts: 3}
		}, []string{"PublishRetry uses no jitter"}},
		{"publish retries forever", func(p *jsinbox.PublisherTiming) { p.PublishRetry = &jitter.Policy{} },
			[]string{"PublishRetry has no limit", "2m0s duplicate window"}},
		{"publish horizon past the window", func(p *jsinbox.PublisherTiming) {
			// 12.7 s + 13 × 10 s of delays, and 20 × 2 s of timeouts.
			p.PublishRetry = &jitter.Policy{Kind: jitter.Full, MaxAttempts: 20}
		}, []string{"retry a publish 3m2.7s after its first attempt", "longer than the 2m0s duplicate window"}},
		{"publish timeouts count", func(p *jsinbox.PublisherTiming) {
			p.PublishTimeout = 10 * time.Second // 72 s + 10 × 10 s
		}, []string{"retry a publish 2m52s after"}},
		{"narrow window", func(p *jsinbox.PublisherTiming) { p.DuplicateWindow = 30 * time.Second },
			[]string{"longer than the 30s duplicate window"}},
		{"zero window is the server's 2 minutes", func(p *jsinbox.PublisherTiming) {
			p.DuplicateWindow = 0
			p.PublishTimeout = 10 * time.Second
		}, []string{"longer than the 2m0s duplicate window"}},
		{"MaxElapsed bounds the horizon", func(p *jsinbox.PublisherTiming) {
			p.PublishRetry = &jitter.Policy{MaxAttempts: 1000, MaxElapsed: 3 * time.Minute}
		}, []string{"retry a publish 3m0s after"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := goodPublisher()
			tt.change(&p)
			containsAll(t, jsinbox.LintPublisher(p), tt.want)
		})
	}
}

// TestLintZeroTimings: the zero ConsumerTiming describes the server
// defaults: unlimited MaxDeliver, and nothing else. The zero
// PublisherTiming does not retry, so says nothing; in particular nothing
// about deliveries, which are no producer's business.
func TestLintZeroTimings(t *testing.T) {
	t.Parallel()
	w := jsinbox.LintConsumer(jsinbox.ConsumerTiming{})
	if len(w) != 1 || !strings.Contains(w[0], "MaxDeliver 0 means unlimited") {
		t.Errorf("LintConsumer(ConsumerTiming{}) = %q", w)
	}
	if w := jsinbox.LintPublisher(jsinbox.PublisherTiming{}); len(w) != 0 {
		t.Errorf("LintPublisher(PublisherTiming{}) = %q", w)
	}
	retry := jitter.Policy{Kind: jitter.None}
	for _, w := range jsinbox.LintPublisher(jsinbox.PublisherTiming{PublishRetry: &retry}) {
		if strings.Contains(w, "MaxDeliver") {
			t.Errorf("LintPublisher warns about a consumer setting: %s", w)
		}
	}
}

func ExampleLintConsumer() {
	for _, w := range jsinbox.LintConsumer(jsinbox.ConsumerTiming{MaxDeliver: -1, BareNak: true}) {
		fmt.Println("-", w)
	}
	// Output:
	// - MaxDeliver -1 means unlimited: a message that always fails is redelivered forever; set a finite MaxDeliver and dead-letter what exhausts it
	// - a bare Nak() asks for immediate redelivery: a failing message comes straight back, in a hot loop and in lockstep with every other client; use NakWithDelay with a jittered Policy.Delay(NumDelivered)
}

func ExampleLintPublisher() {
	for _, w := range jsinbox.LintPublisher(jsinbox.PublisherTiming{
		PublishRetry: &jitter.Policy{Kind: jitter.Full, MaxAttempts: 20},
	}) {
		fmt.Println("-", w)
	}
	// Output:
	// - PublishRetry can retry a publish 2m22.7s after its first attempt, longer than the 2m0s duplicate window: a late retry of a publish that did land is stored twice; lower MaxAttempts or MaxElapsed, or widen the window
}
