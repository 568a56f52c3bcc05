package jitter

import (
	"fmt"
	"math"
	"time"
)

// LintPolicy returns a warning for each hazard of p on its own, each starting with name, or
// nil: p is invalid (see Validate), or it uses no jitter, so that every client that failed at the
// same moment retries at the same moments.
//
// The hazards of a policy together with what it retries against (a JetStream durable's
// AckWait, MaxDeliver and BackOff, a stream's duplicate window) are checked where those are
// known: the consumer's and the producer's configuration checks (jsinbox.CheckConsumer and
// jsinbox.CheckStream).
func LintPolicy(name string, p Policy) []string {
	var w []string
	if err := p.Validate(); err != nil {
		w = append(w, fmt.Sprintf("%s: %v", name, err))
	}
	if p.Kind == None {
		w = append(w, fmt.Sprintf("%s uses no jitter: every client that failed at the same moment retries at the same "+
			"moments; use Decorrelated (the default) or Full", name))
	}
	return w
}

// HorizonWithTimeout bounds the time from a retry loop's first attempt to its last retry when
// each attempt waits up to timeout before it counts as failed: the waiting of Horizon plus
// timeout for each attempt before the last one, or MaxElapsed if shorter. A timeout of zero or
// less is not counted. ok is false when p has no limit (MaxAttempts 0, MaxElapsed 0).
func (p Policy) HorizonWithTimeout(timeout time.Duration) (d time.Duration, ok bool) {
	p = p.normalized()
	h, ok := p.Horizon()
	if !ok || p.MaxAttempts == 0 || timeout <= 0 {
		return h, ok
	}
	if timeout > (math.MaxInt64-h)/time.Duration(p.MaxAttempts) {
		h = math.MaxInt64
	} else {
		h += time.Duration(p.MaxAttempts) * timeout
	}
	if p.MaxElapsed > 0 {
		h = min(h, p.MaxElapsed)
	}
	return h, true
}
