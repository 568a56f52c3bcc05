package jsinbox

import (
	"log/slog"
	"sync"
	"time"
)

// Dead-letter warnings: the first few of each reason are logged one by
// one, then a summary per reason at most every dlSummaryEvery, so that a
// poison batch does not flood the logs.
const (
	dlFirstWarnings = 3
	dlSummaryEvery  = time.Minute
	dlMaxReasons    = 100 // distinct reasons tracked; more share one entry
	dlOtherReasons  = "(other reasons)"
)

// dlSampler decides which dead-letter warnings are logged. Its zero value
// is ready to use.
type dlSampler struct {
	mu       sync.Mutex
	now      func() time.Time // time.Now unless a test sets it
	byReason map[string]*dlCount
}

type dlCount struct {
	logged     int
	suppressed int64
	since      time.Time // start of the current summary period
}

// warn logs one dead letter: in full for the first dlFirstWarnings of its
// reason, then as a count per reason every dlSummaryEvery.
func (s *dlSampler) warn(log *slog.Logger, reason string, attrs ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now
	if s.now != nil {
		now = s.now
	}
	if s.byReason == nil {
		s.byReason = map[string]*dlCount{}
	}
	key := reason
	c := s.byReason[key]
	if c == nil && len(s.byReason) >= dlMaxReasons {
		key = dlOtherReasons
		c = s.byReason[key]
	}
	if c == nil {
		c = &dlCount{}
		s.byReason[key] = c
	}
	if c.logged < dlFirstWarnings {
		c.logged++
		if c.logged == dlFirstWarnings {
			attrs = append(attrs, "note", "further dead letters for this reason are counted in a summary every "+dlSummaryEvery.String())
		}
		log.Warn("jsinbox: dead-lettered", append(attrs, "reason", reason)...)
		c.since = now()
		return
	}
	c.suppressed++
	if t := now(); t.Sub(c.since) >= dlSummaryEvery {
		log.Warn("jsinbox: dead-lettered (summary)", "reason", key, "count", c.suppressed, "period", t.Sub(c.since).Round(time.Second))
		c.suppressed, c.since = 0, t
	}
}

// flush logs the counts not yet summarised, when the consumer stops.
func (s *dlSampler) flush(log *slog.Logger) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now
	if s.now != nil {
		now = s.now
	}
	for reason, c := range s.byReason {
		if c.suppressed > 0 {
			log.Warn("jsinbox: dead-lettered (summary)", "reason", reason, "count", c.suppressed, "period", now().Sub(c.since).Round(time.Second))
			c.suppressed, c.since = 0, now()
		}
	}
}
