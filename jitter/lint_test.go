package jitter_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/jitter"
)

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
