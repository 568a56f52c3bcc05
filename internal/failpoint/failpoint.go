// Package failpoint arms the named points of internal/hook for tests and the
// chaos harness: a crash between COMMIT and ACK, a panic in an effect, a
// lost ack or PubAck. A Set says which points fire when; Attach installs it
// on a processor, consumer or publisher. Parallel tests each attach their
// own Set and do not see each other's points.
package failpoint

import (
	"errors"
	"sync"

	"github.com/jetinbox/jetinbox/internal/hook"
)

// The named points.
const (
	BeforeClaim  = hook.BeforeClaim
	BeforeCommit = hook.BeforeCommit
	AfterCommit  = hook.AfterCommit
	EffectPanic  = hook.EffectPanic
	SkipAck      = hook.SkipAck
	LosePubAck   = hook.LosePubAck
	// The outbox relay's points.
	RelayBeforePublish = hook.RelayBeforePublish
	RelayPubAckWait    = hook.RelayPubAckWait
	RelayBeforeMark    = hook.RelayBeforeMark
)

// Set is a group of armed points. The zero value is not usable; use New.
type Set struct {
	mu     sync.Mutex
	points map[hook.Point]*point
}

type point struct {
	remaining int // < 0: always
	every     int // fire on every n-th pass when > 0
	passes    int
	hits      int
}

// New returns an empty Set.
func New() *Set { return &Set{points: map[hook.Point]*point{}} }

// Enable arms p to fire the next times passes (times < 0: every pass).
func (s *Set) Enable(p hook.Point, times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.points[p] = &point{remaining: times}
}

// EnableEvery arms p to fire on every n-th pass, at most times times
// (times < 0: no limit).
func (s *Set) EnableEvery(p hook.Point, n, times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.points[p] = &point{remaining: times, every: n}
}

// Hits returns how often p fired.
func (s *Set) Hits(p hook.Point) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pt := s.points[p]; pt != nil {
		return pt.hits
	}
	return 0
}

// Attach installs s on each target: an *inbox.Processor[pgx.Tx], a
// *jsinbox.Consumer, a *jsinbox.Publisher or an *outbox.Relay (whose
// publisher then loses PubAcks too, if LosePubAck is armed).
func (s *Set) Attach(targets ...any) {
	for _, t := range targets {
		hook.Attach(t, s.hit)
	}
}

// AttachAll installs several sets on one target: a point fires when one of
// them fires it, asked in order (a later set is not asked, and its passes
// not counted, once an earlier one fired). One set may be shared by several
// targets, so that a point armed once fires in whichever passes it first.
func AttachAll(target any, sets ...*Set) {
	hook.Attach(target, func(name hook.Point) bool {
		for _, s := range sets {
			if s.hit(name) {
				return true
			}
		}
		return false
	})
}

func (s *Set) hit(name hook.Point) bool {
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

// IsCrash reports whether err is, or wraps, a simulated crash.
func IsCrash(err error) bool {
	var c *hook.Crash
	return errors.As(err, &c)
}
