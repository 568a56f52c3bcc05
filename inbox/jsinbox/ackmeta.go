// Reading a delivery's metadata from its ack subject without allocating.

package jsinbox

import (
	"strings"
	"time"
)

// ackMeta is what the consumer needs of a delivery's metadata.
type ackMeta struct {
	delivered, streamSeq uint64
	stored               time.Time
}

// parseAckReply reads the delivery count, the stream sequence and the
// stored time from a JetStream ack subject, as jetstream.Msg.Metadata does
// but without allocating the metadata and its strings: the consumer reads
// these three for every message of every batch. It accepts the subject
// forms Metadata accepts,
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//	$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>...]
//
// and reports false for anything else (the caller then asks Metadata).
func parseAckReply(reply string) (ackMeta, bool) {
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	if !ok {
		return ackMeta{}, false
	}
	// Tokens after "$JS.ACK.": 7 in the old form, 9 or more in the new.
	n := strings.Count(rest, ".") + 1
	skip := 0 // tokens before <delivered>
	switch {
	case n == 7:
		skip = 2
	case n >= 9:
		skip = 4
	default:
		return ackMeta{}, false
	}
	for range skip {
		_, rest, _ = strings.Cut(rest, ".")
	}
	var f [4]uint64 // delivered, sseq, cseq, tm
	for i := range f {
		var tok string
		tok, rest, _ = strings.Cut(rest, ".")
		f[i] = parseNum(tok)
	}
	return ackMeta{delivered: f[0], streamSeq: f[1], stored: time.Unix(0, int64(f[3]))}, true
}

// parseNum parses a decimal token of an ack subject as the client does: 0
// for an empty token or one with anything but digits.
func parseNum(s string) uint64 {
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	return n
}
