package delivery

import (
	"sync"
	"time"

	"github.com/jetinbox/jetinbox/jitter"
)

// BreakerState is an endpoint's circuit breaker state.
type BreakerState int

// The states, as the breaker-state metric reports them.
const (
	BreakerClosed   BreakerState = 0 // calls flow
	BreakerOpen     BreakerState = 1 // no calls until the jittered open time has passed
	BreakerHalfOpen BreakerState = 2 // one probe call decides
)

// String names the state.
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	default:
		return "half-open"
	}
}

// BreakerConfig configures every endpoint's circuit breaker.
type BreakerConfig struct {
	// Failures is how many failed calls in a row (no answer, 5xx, 408,
	// 409, 425, 429) open the breaker. Default 5.
	Failures int
	// Open is the policy of the open time: the n-th opening in a row
	// waits Open.Delay(n), so the wait grows and every dispatcher draws
	// its own. Default decorrelated jitter, Base 1s, Cap 60s.
	Open jitter.Policy
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Failures <= 0 {
		c.Failures = 5
	}
	if c.Open.Base == 0 {
		c.Open.Base = time.Second
	}
	if c.Open.Cap == 0 {
		c.Open.Cap = time.Minute
	}
	return c
}

// breaker is one endpoint's circuit breaker. Its own small code rather
// than a library's: the open time is drawn with jitter each time, so
// dispatchers whose breakers opened together do not probe together.
type breaker struct {
	cfg BreakerConfig

	mu       sync.Mutex
	state    BreakerState
	failures int
	openings int
	until    time.Time
	probing  bool
	changed  func(BreakerState)
}

// slots returns how many calls may start now given want free slots, and
// when to ask again if none may.
func (b *breaker) slots(now time.Time, want int) (int, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerOpen:
		if now.Before(b.until) {
			return 0, b.until
		}
		b.set(BreakerHalfOpen)
		fallthrough
	case BreakerHalfOpen:
		if b.probing {
			return 0, now.Add(b.cfg.Open.Base)
		}
		b.probing = true
		return min(want, 1), time.Time{}
	}
	return want, time.Time{}
}

// unprobe gives back a probe slot that was not used (nothing was due).
func (b *breaker) unprobe() {
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// record takes a call's result: ok, or a failure of the endpoint.
func (b *breaker) record(now time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	wasProbe := b.state == BreakerHalfOpen
	if wasProbe {
		b.probing = false
	}
	if ok {
		b.failures, b.openings = 0, 0
		if b.state != BreakerClosed {
			b.set(BreakerClosed)
		}
		return
	}
	b.failures++
	if wasProbe || (b.state == BreakerClosed && b.failures >= b.cfg.Failures) {
		b.openings++
		b.until = now.Add(b.cfg.Open.Delay(b.openings))
		b.set(BreakerOpen)
	}
}

func (b *breaker) set(s BreakerState) {
	b.state = s
	if b.changed != nil {
		b.changed(s)
	}
}

// State returns the breaker's state.
func (b *breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}
