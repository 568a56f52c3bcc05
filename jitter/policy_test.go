package jitter_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/jetinbox/jetinbox/jitter"
)

var kinds = []jitter.Kind{jitter.None, jitter.Full, jitter.Equal, jitter.Decorrelated}

func seeded(seed uint64) func() float64 { return rand.New(rand.NewPCG(seed, seed)).Float64 }

// constant returns a Rand that always returns v.
func constant(v float64) func() float64 { return func() float64 { return v } }

func TestParseKind(t *testing.T) {
	t.Parallel()
	for _, k := range append(kinds, 0) {
		got, err := jitter.ParseKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseKind(%q) = %v, %v; want %v", k.String(), got, err, k)
		}
	}
	if k, err := jitter.ParseKind("FULL"); err != nil || k != jitter.Full {
		t.Errorf("ParseKind(FULL) = %v, %v; want full", k, err)
	}
	if _, err := jitter.ParseKind("fast"); !errors.Is(err, jitter.ErrInvalid) {
		t.Errorf("ParseKind(fast) error = %v; want ErrInvalid", err)
	}
	var k jitter.Kind
	if err := k.UnmarshalText([]byte("equal")); err != nil || k != jitter.Equal {
		t.Errorf("UnmarshalText(equal) = %v, %v", k, err)
	}
	if s := jitter.Kind(9).String(); s != "Kind(9)" {
		t.Errorf("Kind(9).String() = %q", s)
	}
}

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	p := jitter.Policy{}.WithDefaults()
	if p.Kind != jitter.DefaultKind || p.Base != jitter.DefaultBase || p.Cap != jitter.DefaultCap ||
		p.MaxAttempts != 0 || p.MaxElapsed != 0 {
		t.Errorf("Policy{}.WithDefaults() = %+v", p)
	}
	if p := (jitter.Policy{Base: time.Minute}).WithDefaults(); p.Cap != time.Minute {
		t.Errorf("Cap for Base 1m = %v; want 1m", p.Cap)
	}
	if err := (jitter.Policy{}).Validate(); err != nil {
		t.Errorf("Policy{}.Validate() = %v", err)
	}
	if err := jitter.Default().Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, p := range []jitter.Policy{
		{Kind: 9},
		{Base: -time.Second},
		{Base: time.Second, Cap: time.Millisecond},
		{MaxAttempts: -1},
		{MaxElapsed: -time.Second},
	} {
		if err := p.Validate(); !errors.Is(err, jitter.ErrInvalid) {
			t.Errorf("%+v.Validate() = %v; want ErrInvalid", p, err)
		}
	}
}

// TestDelaysInRange checks the promise of the package: every delay within [0, Cap], and
// Decorrelated's within [Base, Cap], for stateful and stateless use, for well-behaved and
// misbehaving Rand functions, and for policies nobody validated.
func TestDelaysInRange(t *testing.T) {
	t.Parallel()
	rands := map[string]func() float64{
		"seeded": seeded(1), "zero": constant(0), "almost one": constant(math.Nextafter(1, 0)),
		"one": constant(1), "negative": constant(-3), "above one": constant(7), "NaN": constant(math.NaN()),
	}
	shapes := []struct{ base, cap time.Duration }{
		{100 * time.Millisecond, 10 * time.Second},
		{time.Nanosecond, time.Nanosecond},
		{time.Second, time.Second},
		{3 * time.Nanosecond, 1000 * time.Hour},
		{0, 0},
		{-time.Second, -time.Second},    // invalid: clamped to the defaults
		{time.Second, time.Millisecond}, // invalid: Cap raised to Base
	}
	for _, k := range kinds {
		for name, r := range rands {
			for _, s := range shapes {
				p := jitter.Policy{Kind: k, Base: s.base, Cap: s.cap, Rand: r}
				// The bounds NewBackOff and Delay promise, clamping as Validate's doc says.
				base, hi := s.base, s.cap
				if base <= 0 {
					base = jitter.DefaultBase
				}
				if hi <= 0 {
					hi = max(jitter.DefaultCap, base)
				}
				hi = max(hi, base)
				lo := time.Duration(0)
				if k == jitter.Decorrelated {
					lo = base
				}
				check := func(how string, n int, d time.Duration) {
					t.Helper()
					if d < lo || d > hi {
						t.Fatalf("%v, rand %s, base %v, cap %v: %s %d = %v, outside [%v, %v]",
							k, name, s.base, s.cap, how, n, d, lo, hi)
					}
				}
				b := p.NewBackOff()
				for n := range 200 {
					check("NextBackOff", n, b.NextBackOff())
				}
				for _, n := range []int{-5, 0, 1, 2, 10, 62, 63, 64, 100, 1000, math.MaxInt} {
					check("Delay", n, p.Delay(n))
				}
			}
		}
	}
}

// TestFormulas pins each kind's formula with a constant Rand.
func TestFormulas(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		kind jitter.Kind
		r    float64
		next []time.Duration // NextBackOff from a new BackOff
		want []time.Duration // Delay(1), Delay(2), …
	}{
		{jitter.None, 0.5, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1000 * ms, 1000 * ms},
			[]time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1000 * ms}},
		{jitter.Full, 0.5, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 500 * ms, 500 * ms},
			[]time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 500 * ms}},
		{jitter.Equal, 0.5, []time.Duration{75 * ms, 150 * ms, 300 * ms, 600 * ms, 750 * ms, 750 * ms},
			[]time.Duration{75 * ms, 150 * ms, 300 * ms, 600 * ms, 750 * ms}},
		// 100 + 0.5·(3·prev − 100): 200, 350, 575, 912.5, then capped at 1000.
		{jitter.Decorrelated, 0.5, []time.Duration{200 * ms, 350 * ms, 575 * ms, 912500 * time.Microsecond, 1000 * ms, 1000 * ms},
			// 100 + 0.5·(min(1000, 100·3ⁿ) − 100): 200, 500, 550, 550.
			[]time.Duration{200 * ms, 500 * ms, 550 * ms, 550 * ms}},
		{jitter.Decorrelated, 1, []time.Duration{300 * ms, 900 * ms, 1000 * ms, 1000 * ms},
			[]time.Duration{300 * ms, 900 * ms, 1000 * ms, 1000 * ms}},
		{jitter.Decorrelated, 0, []time.Duration{100 * ms, 100 * ms, 100 * ms},
			[]time.Duration{100 * ms, 100 * ms, 100 * ms}},
	}
	for _, tt := range tests {
		p := jitter.Policy{Kind: tt.kind, Base: 100 * ms, Cap: time.Second, Rand: constant(tt.r)}
		b := p.NewBackOff()
		for i, want := range tt.next {
			if got := b.NextBackOff(); got != want {
				t.Errorf("%v rand %v: NextBackOff #%d = %v; want %v", tt.kind, tt.r, i+1, got, want)
			}
		}
		for i, want := range tt.want {
			if got := p.Delay(i + 1); got != want {
				t.Errorf("%v rand %v: Delay(%d) = %v; want %v", tt.kind, tt.r, i+1, got, want)
			}
		}
	}
}

// TestDecorrelatedDelayRange checks the stateless approximation: Delay(n) within
// [Base, min(Cap, Base·3ⁿ)].
func TestDecorrelatedDelayRange(t *testing.T) {
	t.Parallel()
	p := jitter.Policy{Kind: jitter.Decorrelated, Base: 10 * time.Millisecond, Cap: 5 * time.Second, Rand: seeded(3)}
	for n := 1; n <= 12; n++ {
		hi := min(p.Cap, p.Base*time.Duration(math.Pow(3, float64(n))))
		for range 1000 {
			if d := p.Delay(n); d < p.Base || d > hi {
				t.Fatalf("Delay(%d) = %v, outside [%v, %v]", n, d, p.Base, hi)
			}
		}
	}
}

func TestSameSeedSameDelays(t *testing.T) {
	t.Parallel()
	run := func(k jitter.Kind, seed uint64) []time.Duration {
		p := jitter.Policy{Kind: k, Rand: seeded(seed)}
		b := p.NewBackOff()
		var ds []time.Duration
		for n := range 20 {
			ds = append(ds, b.NextBackOff(), p.Delay(n+1))
		}
		return ds
	}
	for _, k := range kinds {
		a, b, c := run(k, 7), run(k, 7), run(k, 8)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("%v: seed 7 gave %v, then %v", k, a, b)
		}
		if k != jitter.None && fmt.Sprint(a) == fmt.Sprint(c) {
			t.Errorf("%v: seeds 7 and 8 gave the same delays %v", k, a)
		}
	}
}

func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		b := jitter.Policy{Kind: k, MaxAttempts: 3, Rand: seeded(1)}.NewBackOff()
		for round := range 2 {
			for i := range 3 {
				if d := b.NextBackOff(); d == backoff.Stop {
					t.Fatalf("%v round %d: retry %d got Stop", k, round, i+1)
				}
			}
			for range 3 {
				if d := b.NextBackOff(); d != backoff.Stop {
					t.Fatalf("%v round %d: after 3 retries got %v; want Stop", k, round, d)
				}
			}
			b.Reset()
		}
	}
}

// clock is a settable time source for MaxElapsed.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func TestMaxElapsed(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Unix(1e9, 0)}
	// None: 100 ms, 200 ms, 400 ms, 800 ms, 1.6 s, …
	b := jitter.Policy{Kind: jitter.None, MaxElapsed: time.Second, Now: c.Now}.NewBackOff()
	for _, want := range []time.Duration{100, 200, 400} {
		d := b.NextBackOff()
		if d != want*time.Millisecond {
			t.Fatalf("NextBackOff = %v; want %vms", d, want)
		}
		c.now = c.now.Add(d)
	}
	// 700 ms elapsed; the next delay, 800 ms, would end at 1.5 s > 1 s.
	if d := b.NextBackOff(); d != backoff.Stop {
		t.Fatalf("NextBackOff after 700ms = %v; want Stop", d)
	}
	// Stop sticks even though nothing more is drawn.
	if d := b.NextBackOff(); d != backoff.Stop {
		t.Fatalf("NextBackOff after Stop = %v; want Stop", d)
	}
	// Reset restarts the clock and the sequence.
	b.Reset()
	if d := b.NextBackOff(); d != 100*time.Millisecond {
		t.Fatalf("NextBackOff after Reset = %v; want 100ms", d)
	}
	// Time spent outside the delays counts too.
	c.now = c.now.Add(950 * time.Millisecond)
	if d := b.NextBackOff(); d != backoff.Stop {
		t.Fatalf("NextBackOff 950ms after Reset = %v; want Stop", d)
	}
}

// TestMaxElapsedSticks: once a delay did not fit, a shorter one drawn later does not revive the
// loop: the caller has already given up.
func TestMaxElapsedSticks(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Unix(1e9, 0)}
	draws := []float64{0.9, 0.9, 0, 0}
	next := func() float64 { r := draws[0]; draws = draws[1:]; return r }
	b := jitter.Policy{Kind: jitter.Full, MaxElapsed: 150 * time.Millisecond, Rand: next, Now: c.Now}.NewBackOff()
	if d := b.NextBackOff(); d != 90*time.Millisecond {
		t.Fatalf("first NextBackOff = %v; want 90ms", d)
	}
	c.now = c.now.Add(90 * time.Millisecond)
	if d := b.NextBackOff(); d != backoff.Stop { // 90 ms + 180 ms > 150 ms
		t.Fatalf("second NextBackOff = %v; want Stop", d)
	}
	if d := b.NextBackOff(); d != backoff.Stop {
		t.Fatalf("NextBackOff after Stop = %v; want Stop although 0s would fit", d)
	}
}

func TestZeroLimitsNeverStop(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Unix(1e9, 0)}
	b := jitter.Policy{Now: c.Now}.NewBackOff()
	for range 10_000 {
		if d := b.NextBackOff(); d == backoff.Stop {
			t.Fatal("a policy without limits returned Stop")
		}
		c.now = c.now.Add(time.Hour) // backoff.ExponentialBackOff would have stopped at 15 minutes
	}
}

func TestReset(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		b := jitter.Policy{Kind: k, Rand: constant(0.75)}.NewBackOff()
		var first, again []time.Duration
		for range 8 {
			first = append(first, b.NextBackOff())
		}
		b.Reset()
		for range 8 {
			again = append(again, b.NextBackOff())
		}
		if fmt.Sprint(first) != fmt.Sprint(again) {
			t.Errorf("%v: %v before Reset, %v after", k, first, again)
		}
	}
}

func TestRetry(t *testing.T) {
	t.Parallel()
	calls := 0
	err := backoff.Retry(func() error {
		calls++
		return errors.New("down")
	}, jitter.Policy{Base: time.Microsecond, Cap: time.Microsecond, MaxAttempts: 3}.NewBackOff())
	if err == nil || calls != 4 {
		t.Errorf("Retry: %d calls, error %v; want 4 calls (the first and 3 retries) and the error", calls, err)
	}
}

func TestHorizon(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		p    jitter.Policy
		want time.Duration
		ok   bool
	}{
		{jitter.Policy{}, 0, false},
		{jitter.Policy{MaxElapsed: time.Minute}, time.Minute, true},
		// 100+200+400+800+1600+3200+6400 ms, then 3 × 10 s.
		{jitter.Policy{Kind: jitter.Full, MaxAttempts: 10}, 42700 * ms, true},
		{jitter.Policy{Kind: jitter.None, MaxAttempts: 3}, 700 * ms, true},
		{jitter.Policy{Kind: jitter.Equal, MaxAttempts: 3, MaxElapsed: 500 * ms}, 500 * ms, true},
		// 300+900+2700+8100 ms, then 6 × 10 s.
		{jitter.Default(), 72 * time.Second, true},
		{jitter.Policy{Kind: jitter.Decorrelated, MaxAttempts: 2}, 1200 * ms, true},
		{jitter.Policy{Cap: time.Duration(math.MaxInt64), MaxAttempts: math.MaxInt}, time.Duration(math.MaxInt64), true},
	}
	for _, tt := range tests {
		got, ok := tt.p.Horizon()
		if got != tt.want || ok != tt.ok {
			t.Errorf("%+v.Horizon() = %v, %v; want %v, %v", tt.p, got, ok, tt.want, tt.ok)
		}
	}
}

// TestConcurrentDelay runs Delay and NewBackOff from one Policy in many goroutines; with -race
// it checks that the default randomness needs no lock.
func TestConcurrentDelay(t *testing.T) {
	t.Parallel()
	p := jitter.Default()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			b := p.NewBackOff()
			for n := range 1000 {
				if d := p.Delay(n%20 + 1); d < p.Base || d > p.Cap {
					t.Errorf("Delay = %v", d)
				}
				b.NextBackOff()
			}
		})
	}
	wg.Wait()
}

func BenchmarkNewBackOff(b *testing.B) {
	p := jitter.Default()
	b.ReportAllocs()
	for b.Loop() {
		bo := p.NewBackOff()
		for range 5 {
			bo.NextBackOff()
		}
	}
}

func BenchmarkDelay(b *testing.B) {
	p := jitter.Default()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n++
		p.Delay(n%10 + 1)
	}
}
