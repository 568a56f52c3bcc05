package jitter_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/jitter"
)

// good is a configuration Lint has nothing to say about.
func good() jitter.Settings {
	nak, publish := jitter.Default(), jitter.Default()
	return jitter.Settings{
		AckWait:         30 * time.Second,
		MaxDeliver:      10,
		NakDelay:        &nak,
		DuplicateWindow: 2 * time.Minute,
		PublishRetry:    &publish,
		PublishTimeout:  2 * time.Second,
	}
}

func TestLintClean(t *testing.T) {
	t.Parallel()
	if w := jitter.Lint(good()); len(w) != 0 {
		t.Errorf("Lint(good) = %q; want none", w)
	}
	// A long nak delay is fine: the server times it from the nak.
	s := good()
	s.NakDelay = &jitter.Policy{Base: time.Minute, Cap: time.Hour}
	if w := jitter.Lint(s); len(w) != 0 {
		t.Errorf("Lint with nak Cap > AckWait = %q; want none", w)
	}
}

func TestLint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*jitter.Settings)
		want   []string // each must be in one warning
	}{
		{"unlimited MaxDeliver", func(s *jitter.Settings) { s.MaxDeliver = -1 }, []string{"MaxDeliver -1 means unlimited"}},
		{"zero MaxDeliver", func(s *jitter.Settings) { s.MaxDeliver = 0 }, []string{"MaxDeliver 0 means unlimited"}},
		{"BackOff", func(s *jitter.Settings) {
			s.BackOff = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}
			s.AckWait = time.Second
			s.NakDelay = nil
		}, []string{"same delays to everyone", "does not apply to Nak"}},
		{"BackOff longer than MaxDeliver", func(s *jitter.Settings) {
			s.BackOff = []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
			s.MaxDeliver = 2
		}, []string{"fixed list", "server rejects a BackOff longer than MaxDeliver"}},
		{"AckWait replaced by BackOff", func(s *jitter.Settings) { s.BackOff = []time.Duration{time.Second} },
			[]string{"AckWait 30s is replaced by BackOff[0] = 1s"}},
		{"BackOff stretches nak delays", func(s *jitter.Settings) {
			s.BackOff = []time.Duration{time.Second, time.Minute}
			s.AckWait = time.Second
		}, []string{"each nak delay grows by up to 59s"}},
		{"bare Nak", func(s *jitter.Settings) { s.BareNak = true }, []string{"bare Nak() asks for immediate redelivery"}},
		{"nak without jitter", func(s *jitter.Settings) { s.NakDelay = &jitter.Policy{Kind: jitter.None} },
			[]string{"NakDelay uses no jitter"}},
		{"invalid nak policy", func(s *jitter.Settings) { s.NakDelay = &jitter.Policy{Base: time.Second, Cap: time.Millisecond} },
			[]string{"NakDelay: jitter: invalid policy: Cap 1ms is below Base 1s"}},
		{"publish without jitter", func(s *jitter.Settings) { s.PublishRetry = &jitter.Policy{Kind: jitter.None, MaxAttempts: 3} },
			[]string{"PublishRetry uses no jitter"}},
		{"publish retries forever", func(s *jitter.Settings) { s.PublishRetry = &jitter.Policy{} },
			[]string{"PublishRetry has no limit", "2m0s duplicate window"}},
		{"publish horizon past the window", func(s *jitter.Settings) {
			// 12.7 s + 13 × 10 s of delays, and 20 × 2 s of timeouts.
			s.PublishRetry = &jitter.Policy{Kind: jitter.Full, MaxAttempts: 20}
		}, []string{"retry a publish 3m2.7s after its first attempt", "longer than the 2m0s duplicate window"}},
		{"publish timeouts count", func(s *jitter.Settings) {
			s.PublishTimeout = 10 * time.Second // 72 s + 10 × 10 s
		}, []string{"retry a publish 2m52s after"}},
		{"narrow window", func(s *jitter.Settings) { s.DuplicateWindow = 30 * time.Second },
			[]string{"longer than the 30s duplicate window"}},
		{"MaxElapsed bounds the horizon", func(s *jitter.Settings) {
			s.PublishRetry = &jitter.Policy{MaxAttempts: 1000, MaxElapsed: 3 * time.Minute}
		}, []string{"retry a publish 3m0s after"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := good()
			tt.change(&s)
			got := jitter.Lint(s)
			for _, want := range tt.want {
				found := false
				for _, w := range got {
					found = found || strings.Contains(w, want)
				}
				if !found {
					t.Errorf("no warning contains %q; got:\n%s", want, strings.Join(got, "\n"))
				}
			}
		})
	}
}

func TestLintZeroSettings(t *testing.T) {
	t.Parallel()
	// The zero Settings describe the server defaults: unlimited MaxDeliver, and nothing else.
	w := jitter.Lint(jitter.Settings{})
	if len(w) != 1 || !strings.Contains(w[0], "MaxDeliver 0 means unlimited") {
		t.Errorf("Lint(Settings{}) = %q", w)
	}
}

func TestLintPolicy(t *testing.T) {
	t.Parallel()
	if w := jitter.LintPolicy("P", jitter.Default()); len(w) != 0 {
		t.Errorf("LintPolicy(Default) = %q; want none", w)
	}
	for _, c := range []struct {
		p    jitter.Policy
		want string
	}{
		{jitter.Policy{Kind: jitter.None}, "P uses no jitter"},
		{jitter.Policy{Base: time.Second, Cap: time.Millisecond}, "P: jitter: invalid policy: Cap 1ms is below Base 1s"},
	} {
		w := jitter.LintPolicy("P", c.p)
		if len(w) != 1 || !strings.Contains(w[0], c.want) {
			t.Errorf("LintPolicy(%+v) = %q; want one warning with %q", c.p, w, c.want)
		}
	}
}

func TestHorizonWithTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		p       jitter.Policy
		timeout time.Duration
		want    time.Duration
		ok      bool
	}{
		{"no limit", jitter.Policy{}, time.Second, 0, false},
		{"no timeout is Horizon", jitter.Default(), 0, 72 * time.Second, true},
		{"each attempt's timeout adds", jitter.Default(), 5 * time.Second, 72*time.Second + 10*5*time.Second, true},
		{"MaxElapsed bounds it", jitter.Policy{MaxAttempts: 1000, MaxElapsed: 3 * time.Minute}, time.Second, 3 * time.Minute, true},
		{"MaxElapsed alone", jitter.Policy{MaxElapsed: time.Minute}, time.Second, time.Minute, true},
		{"saturates", jitter.Policy{MaxAttempts: 10}, math.MaxInt64 / 4, math.MaxInt64, true},
	} {
		got, ok := c.p.HorizonWithTimeout(c.timeout)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: HorizonWithTimeout(%v) = %v, %v; want %v, %v", c.name, c.timeout, got, ok, c.want, c.ok)
		}
	}
}
