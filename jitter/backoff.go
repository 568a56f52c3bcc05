package jitter

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// NewBackOff returns a backoff.BackOff that follows p: each NextBackOff returns the next delay,
// or backoff.Stop once MaxAttempts delays were handed out or the next delay would end after
// MaxElapsed; it then keeps returning backoff.Stop until Reset. Reset starts over: first retry,
// Decorrelated's previous delay back at Base, the MaxElapsed clock restarted.
//
// It costs one small allocation. The BackOff it returns serves one retry loop at a time, like
// every backoff.BackOff; make one per loop (they share nothing but p.Rand). A policy that
// Validate would reject is clamped rather than refused; see Validate.
func (p Policy) NewBackOff() backoff.BackOff {
	b := &policyBackOff{p: p.normalized()}
	b.Reset()
	return b
}

// policyBackOff is the state of one retry loop.
type policyBackOff struct {
	p       Policy
	retries int           // delays handed out since Reset
	prev    time.Duration // Decorrelated: the previous delay
	start   time.Time     // for MaxElapsed; zero when there is none
	stopped bool
}

// Reset implements backoff.BackOff.
func (b *policyBackOff) Reset() {
	b.retries = 0
	b.prev = b.p.Base
	b.stopped = false
	if b.p.MaxElapsed > 0 {
		b.start = b.p.now()
	}
}

// NextBackOff implements backoff.BackOff.
func (b *policyBackOff) NextBackOff() time.Duration {
	if b.stopped || (b.p.MaxAttempts > 0 && b.retries >= b.p.MaxAttempts) {
		b.stopped = true
		return backoff.Stop
	}
	var d time.Duration
	if b.p.Kind == Decorrelated {
		d = b.p.between(float64(b.p.Base), 3*float64(b.prev))
		b.prev = d
	} else {
		d = b.p.exponential(b.retries)
	}
	b.retries++
	if b.p.MaxElapsed > 0 && b.p.now().Sub(b.start)+d > b.p.MaxElapsed {
		b.stopped = true
		return backoff.Stop
	}
	return d
}
