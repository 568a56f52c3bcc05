package jsinbox

import (
	"testing"
	"time"
)

// TestGroupCommitModes: the group commit measures both modes, uses the one
// that publishes more (one by one on a tie), and tries the other again
// every few epochs.
func TestGroupCommitModes(t *testing.T) {
	t.Parallel()
	// run closes one epoch per rate, each a second long, and returns the
	// mode chosen after each.
	run := func(m *modes, rates func(batch bool) int64) []bool {
		var got []bool
		now, settled := time.Unix(0, 0), int64(0)
		m.since = now
		for range 25 {
			now = now.Add(time.Second)
			settled += rates(m.batch)
			m.next(settled, now)
			got = append(got, m.batch)
		}
		return got
	}
	count := func(v []bool) (batches int) {
		for _, b := range v {
			if b {
				batches++
			}
		}
		return batches
	}
	for _, c := range []struct {
		name            string
		single, batch   int64
		wantMostlyBatch bool
	}{
		{"batches publish more", 2000, 9000, true},
		{"one by one publishes more", 7000, 4000, false},
		{"a tie: both keep up with a low rate", 1000, 1000, false},
		{"batches barely more", 1000, 1050, false},
	} {
		m := &modes{batch: true}
		got := run(m, func(batch bool) int64 {
			if batch {
				return c.batch
			}
			return c.single
		})
		b := count(got[2:])
		if c.wantMostlyBatch && b < len(got[2:])-3 || !c.wantMostlyBatch && b > 3 {
			t.Errorf("%s: modes %v, want mostly batch=%v", c.name, got, c.wantMostlyBatch)
		}
		// The other mode is tried again now and then.
		if c.wantMostlyBatch && b == len(got[2:]) || !c.wantMostlyBatch && b == 0 {
			t.Errorf("%s: modes %v: the other mode is never measured again", c.name, got)
		}
	}
}
