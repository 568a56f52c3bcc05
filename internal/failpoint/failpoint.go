// Package failpoint holds named points where tests and the chaos harness stop
// the code on purpose: a crash between COMMIT and ACK, a panic in an effect.
// Points live in a Set carried by a context, so they are off unless a caller
// arms them, cost one context lookup when off, and parallel tests do not see
// each other's points.
package failpoint

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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

// Names lists every point.
var Names = []string{BeforeClaim, BeforeCommit, AfterCommit, EffectPanic, SkipAck, LosePubAck}

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

// Disable disarms name.
func (s *Set) Disable(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.points, name)
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

// Parse reads a spec like "inbox.after-commit=3,consumer.skip-ack=every:10"
// into a new Set: name=N fires N times, name=every:N on every N-th pass,
// a bare name fires once.
func Parse(spec string) (*Set, error) {
	s := New()
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, val, _ := strings.Cut(part, "=")
		known := false
		for _, n := range Names {
			known = known || n == name
		}
		if !known {
			return nil, fmt.Errorf("failpoint: unknown point %q (known: %s)", name, strings.Join(Names, ", "))
		}
		switch {
		case val == "":
			s.Enable(name, 1)
		case strings.HasPrefix(val, "every:"):
			n, err := strconv.Atoi(strings.TrimPrefix(val, "every:"))
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("failpoint: %s: bad every:%q", name, val)
			}
			s.EnableEvery(name, n, -1)
		default:
			n, err := strconv.Atoi(val)
			if err != nil {
				return nil, fmt.Errorf("failpoint: %s: bad count %q", name, val)
			}
			s.Enable(name, n)
		}
	}
	return s, nil
}

type ctxKey struct{}

// With returns a context carrying s.
func With(ctx context.Context, s *Set) context.Context { return context.WithValue(ctx, ctxKey{}, s) }

// From returns the Set carried by ctx, or nil.
func From(ctx context.Context) *Set {
	s, _ := ctx.Value(ctxKey{}).(*Set)
	return s
}

// Hit reports whether the point name, armed in ctx's Set, fires now.
func Hit(ctx context.Context, name string) bool {
	s, _ := ctx.Value(ctxKey{}).(*Set)
	return s != nil && s.hit(name)
}

// Error is returned by code stopped at a failpoint.
type Error struct{ Name string }

func (e *Error) Error() string { return "failpoint " + e.Name + " fired" }
