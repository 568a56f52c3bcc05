package jscheck_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/internal/jscheck"
	"github.com/jetinbox/jetinbox/jitter"
)

// goodConsumer and goodPublisher are timings the lints have nothing to say
// about.
func goodConsumer() jscheck.ConsumerTiming {
	nak := jitter.Default()
	return jscheck.ConsumerTiming{AckWait: 30 * time.Second, MaxDeliver: 10, NakDelay: &nak}
}

func goodPublisher() jscheck.PublisherTiming {
	publish := jitter.Default()
	return jscheck.PublisherTiming{PublishRetry: &publish, PublishTimeout: 2 * time.Second, DuplicateWindow: 2 * time.Minute}
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
	if w := jscheck.LintConsumer(goodConsumer()); len(w) != 0 {
		t.Errorf("LintConsumer(good) = %q; want none", w)
	}
	if w := jscheck.LintPublisher(goodPublisher()); len(w) != 0 {
		t.Errorf("LintPublisher(good) = %q; want none", w)
	}
	// A long nak delay is fine: the server times it from the nak.
	c := goodConsumer()
	c.NakDelay = &jitter.Policy{Base: time.Minute, Cap: time.Hour}
	if w := jscheck.LintConsumer(c); len(w) != 0 {
		t.Errorf("LintConsumer with nak Cap > AckWait = %q; want none", w)
	}
	// A producer that does not retry has nothing to outlast.
	if w := jscheck.LintPublisher(jscheck.PublisherTiming{DuplicateWindow: time.Second}); len(w) != 0 {
		t.Errorf("LintPublisher without retries = %q; want none", w)
	}
}

func TestLintConsumer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*jscheck.ConsumerTiming)
		want   []string // each must be in one warning
	}{
		{"unlimited MaxDeliver", func(c *jscheck.ConsumerTiming) { c.MaxDeliver = -1 }, []string{"MaxDeliver -1 means unlimited"}},
		{"zero MaxDeliver", func(c *jscheck.ConsumerTiming) { c.MaxDeliver = 0 }, []string{"MaxDeliver 0 means unlimited"}},
		{"BackOff", func(c *jscheck.ConsumerTiming) {
			c.BackOff = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}
			c.AckWait = time.Second
			c.NakDelay = nil
		}, []string{"same delays to everyone", "does not apply to Nak"}},
		{"BackOff longer than MaxDeliver", func(c *jscheck.ConsumerTiming) {
			c.BackOff = []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
			c.MaxDeliver = 2
		}, []string{"fixed list", "server rejects a BackOff longer than MaxDeliver"}},
		{"AckWait replaced by BackOff", func(c *jscheck.ConsumerTiming) { c.BackOff = []time.Duration{time.Second} },
			[]string{"AckWait 30s is replaced by BackOff[0] = 1s"}},
		{"BackOff stretches nak delays", func(c *jscheck.ConsumerTiming) {
			c.BackOff = []time.Duration{time.Second, time.Minute}
			c.AckWait = time.Second
		}, []string{"each nak delay grows by up to 59s"}},
		{"bare Nak", func(c *jscheck.ConsumerTiming) { c.BareNak = true }, []string{"bare Nak() asks for immediate redelivery"}},
		{"nak without jitter", func(c *jscheck.ConsumerTiming) { c.NakDelay = &jitter.Policy{Kind: jitter.None} },
			[]string{"NakDelay uses no jitter"}},
		{"invalid nak policy", func(c *jscheck.ConsumerTiming) {
			c.NakDelay = &jitter.Policy{Base: time.Second, Cap: time.Millisecond}
		}, []string{"NakDelay: jitter: invalid policy: Cap 1ms is below Base 1s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := goodConsumer()
			tt.change(&c)
			containsAll(t, jscheck.LintConsumer(c), tt.want)
		})
	}
}

func TestLintPublisher(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*jscheck.PublisherTiming)
		want   []string // each must be in one warning
	}{
		{"publish without jitter", func(p *jscheck.PublisherTiming) {
			p.PublishRetry = &jitter.Policy{Kind: jitter.None, MaxAttempts: 3}
		}, []string{"PublishRetry uses no jitter"}},
		{"publish retries forever", func(p *jscheck.PublisherTiming) { p.PublishRetry = &jitter.Policy{} },
			[]string{"PublishRetry has no limit", "2m0s duplicate window"}},
		{"publish horizon past the window", func(p *jscheck.PublisherTiming) {
			// 12.7 s + 13 × 10 s of delays, and 20 × 2 s of timeouts.
			p.PublishRetry = &jitter.Policy{Kind: jitter.Full, MaxAttempts: 20}
		}, []string{"retry a publish 3m2.7s after its first attempt", "longer than the 2m0s duplicate window"}},
		{"publish timeouts count", func(p *jscheck.PublisherTiming) {
			p.PublishTimeout = 10 * time.Second // 72 s + 10 × 10 s
		}, []string{"retry a publish 2m52s after"}},
		{"narrow window", func(p *jscheck.PublisherTiming) { p.DuplicateWindow = 30 * time.Second },
			[]string{"longer than the 30s duplicate window"}},
		{"zero window is the server's 2 minutes", func(p *jscheck.PublisherTiming) {
			p.DuplicateWindow = 0
			p.PublishTimeout = 10 * time.Second
		}, []string{"longer than the 2m0s duplicate window"}},
		{"MaxElapsed bounds the horizon", func(p *jscheck.PublisherTiming) {
			p.PublishRetry = &jitter.Policy{MaxAttempts: 1000, MaxElapsed: 3 * time.Minute}
		}, []string{"retry a publish 3m0s after"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := goodPublisher()
			tt.change(&p)
			containsAll(t, jscheck.LintPublisher(p), tt.want)
		})
	}
}

// TestLintZeroTimings: the zero ConsumerTiming describes the server
// defaults: unlimited MaxDeliver, and nothing else. The zero
// PublisherTiming does not retry, so says nothing; in particular nothing
// about deliveries, which are no producer's business.
func TestLintZeroTimings(t *testing.T) {
	t.Parallel()
	w := jscheck.LintConsumer(jscheck.ConsumerTiming{})
	if len(w) != 1 || !strings.Contains(w[0], "MaxDeliver 0 means unlimited") {
		t.Errorf("LintConsumer(ConsumerTiming{}) = %q", w)
	}
	if w := jscheck.LintPublisher(jscheck.PublisherTiming{}); len(w) != 0 {
		t.Errorf("LintPublisher(PublisherTiming{}) = %q", w)
	}
	retry := jitter.Policy{Kind: jitter.None}
	for _, w := range jscheck.LintPublisher(jscheck.PublisherTiming{PublishRetry: &retry}) {
		if strings.Contains(w, "MaxDeliver") {
			t.Errorf("LintPublisher warns about a consumer setting: %s", w)
		}
	}
}

func ExampleLintConsumer() {
	for _, w := range jscheck.LintConsumer(jscheck.ConsumerTiming{MaxDeliver: -1, BareNak: true}) {
		fmt.Println("-", w)
	}
	// Output:
	// - MaxDeliver -1 means unlimited: a message that always fails is redelivered forever; set a finite MaxDeliver and dead-letter what exhausts it
	// - a bare Nak() asks for immediate redelivery: a failing message comes straight back, in a hot loop and in lockstep with every other client; use NakWithDelay with a jittered Policy.Delay(NumDelivered)
}

func ExampleLintPublisher() {
	for _, w := range jscheck.LintPublisher(jscheck.PublisherTiming{
		PublishRetry: &jitter.Policy{Kind: jitter.Full, MaxAttempts: 20},
	}) {
		fmt.Println("-", w)
	}
	// Output:
	// - PublishRetry can retry a publish 2m22.7s after its first attempt, longer than the 2m0s duplicate window: a late retry of a publish that did land is stored twice; lower MaxAttempts or MaxElapsed, or widen the window
}
