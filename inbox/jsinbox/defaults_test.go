package jsinbox

import (
	"testing"

	"github.com/jetinbox/jetinbox/internal/jscheck"
)

// TestDefaultsMatchChecks: the defaults go doc shows are the values the
// configuration checks and the replay horizon assume.
func TestDefaultsMatchChecks(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"DefaultNakCap", DefaultNakCap, jscheck.DefaultNakCap},
		{"DefaultAckWait", DefaultAckWait, jscheck.DefaultAckWait},
		{"DefaultMaxDeliver", DefaultMaxDeliver, jscheck.DefaultMaxDeliver},
		{"DefaultDuplicateWindow", DefaultDuplicateWindow, jscheck.DefaultDuplicateWindow},
		{"DefaultMaxMsgSize", DefaultMaxMsgSize, jscheck.DefaultMaxMsgSize},
		{"DeadLetterHeadroom", DeadLetterHeadroom, jscheck.DeadLetterHeadroom},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, the checks assume %v", c.name, c.got, c.want)
		}
	}
}
