// Package failpoint holds named points where tests and the chaos harness stop
// the code on purpose: a crash between COMMIT and ACK, a panic in an effect.
// Points live in a Set carried by a context, so they are off unless a caller
// arms them, cost one context lookup when off, and parallel tests do not see
// each other's points.
package failpoint

import (
	"context"
	"sync"
)

// The named points.
const (
	// BeforeClaim fires after BEGIN, before the claim (a crash after fetch).
	BeforeClaim = "inbox.before-claim"
	// BeforeCommit fires after claims and effects, before COMMIT.
	BeforeCommit = "inbox.before-commit"
	// AfterCommit fires after COMMIT, before the transport acks.
	AfterCommit = "inbox.after-commit"
	// EffectPanic makes the effect handler panic.
	EffectPanic = "inbox.effect-panic"
	// SkipAck makes the consumer drop the ack of a committed batch on the
	// floor, as a lost ack on the wire would.
	SkipAck = "consumer.skip-ack"
	// LosePubAck makes the producer treat a successful publish as timed out,
	// so it retries with the same ID.
	LosePubAck = "producer.lose-puback"
)

// Set is a group of armed points. The zero value is not usable; use New.
type Set struct {
	mu     sync.Mutex
	points map[string]*point
}

type point struct {
	remaining int // < 0: always
	every     int // fire on every n-th pass when > 0
	passes    int
	hits      int
}

// New returns an empty Set.
func New() *Set { return &Set{points: map[string]*point{}} }

// Enable arms name to fire the next times passes (times < 0: every pass).
func (s *Set) Enable(name string, times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.points[name] = &point{remaining: times}
}

// EnableEvery arms name to fire on every n-th pass, at most times times
// (times < 0: no limit).
func (s *Set) EnableEvery(name string, n, times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.points[name] = &point{remaining: times, every: n}
}

// Hits returns how often name fired.
func (s *Set) Hits(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.points[name]; p != nil {
		return p.hits
	}
	return 0
}

func (s *Set) hit(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.points[name]
	if p == nil || p.remaining == 0 {
		return false
	}
	p.passes++
	if p.every > 0 && p.passes%p.every != 0 {
		return false
	}
	if p.remaining > 0 {
		p.remaining--
	}
	p.hits++
	return true
}

type ctxKey struct{}

// With returns a context carrying s.
func With(ctx context.Context, s *Set) context.Context { return context.WithValue(ctx, ctxKey{}, s) }

// Hit reports whether the point name, armed in ctx's Set, fires now.
func Hit(ctx context.Context, name string) bool {
	s, _ := ctx.Value(ctxKey{}).(*Set)
	return s != nil && s.hit(name)
}

// Error is returned by code stopped at a failpoint.
type Error struct{ Name string }

func (e *Error) Error() string { return "failpoint " + e.Name + " fired" }
