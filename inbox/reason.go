package inbox

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxReasonLen is the longest reason, in bytes, that an [Outcome], an inbox
// row or a dead letter carries; [SanitizeReason] cuts longer ones.
const MaxReasonLen = 512

// SanitizeReason makes an error text fit to store and to send as a header:
// control characters (newlines, tabs, escapes) become spaces, runs of
// spaces one space, and the result is cut to [MaxReasonLen] bytes at a
// character boundary, ending in "…" when cut. Stacks and long dumps belong
// in the log, not in a row or a header.
func SanitizeReason(s string) string {
	var b strings.Builder
	b.Grow(min(len(s), MaxReasonLen))
	space := false
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.IsSpace(r) {
			if !space && b.Len() > 0 {
				b.WriteByte(' ')
			}
			space = true
		} else {
			b.WriteRune(r)
			space = false
		}
		if b.Len() > MaxReasonLen {
			break
		}
	}
	out := strings.TrimRight(b.String(), " ")
	if len(out) <= MaxReasonLen {
		return out
	}
	const ellipsis = "…"
	cut := MaxReasonLen - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(out[cut]) {
		cut--
	}
	return strings.TrimRight(out[:cut], " ") + ellipsis
}
