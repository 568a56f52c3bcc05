package console_test

import (
	"testing"

	"github.com/jetinbox/jetinbox/console"
)

// TestSafe: hostile bytes become text that reads as what it is.
func TestSafe(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain é ✓", 100, "plain é ✓"},
		{"a\xffb\xfe", 100, `a\xffb\xfe`},
		{"line\nnext\ttab", 100, "line\nnext\ttab"},
		{"bell\x07esc\x1b[31m", 100, `bell\u0007esc\u001b[31m`},
		{"user\u202egnp.exe", 100, `user\u202egnp.exe`},
		{"\u2066isolate\u2069", 100, `\u2066isolate\u2069`},
		{"<script>alert(1)</script>", 100, "<script>alert(1)</script>"}, // html/template escapes it
		{"abcdef", 3, "abc… (cut at 3 bytes)"},
		{"é", 1, `\xc3… (cut at 1 bytes)`},
	} {
		if got := console.Safe([]byte(c.in), c.max); got != c.want {
			t.Errorf("Safe(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}
