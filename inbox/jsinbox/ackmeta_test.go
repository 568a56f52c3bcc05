package jsinbox

import (
	"testing"
	"time"
)

func TestParseAckReply(t *testing.T) {
	for _, c := range []struct {
		reply string
		ok    bool
		want  ackMeta
	}{
		{"$JS.ACK.INTENTS.ledger.3.1234.99.1700000000123456789.17", true, ackMeta{3, 1234, time.Unix(0, 1700000000123456789)}},
		{"$JS.ACK._.ACCHASH.INTENTS.ledger.1.5.5.1700000000000000001.0.RaNd0m", true, ackMeta{1, 5, time.Unix(0, 1700000000000000001)}},
		{"$JS.ACK.hub.ACCHASH.INTENTS.ledger.20.7.8.42.0", true, ackMeta{20, 7, time.Unix(0, 42)}},
		{"$JS.ACK.dom.ACCHASH.INTENTS.ledger.2.9.8.42.0.tok.more", true, ackMeta{2, 9, time.Unix(0, 42)}},
		{"$JS.ACK.INTENTS.ledger.x.1234.99.1.17", true, ackMeta{0, 1234, time.Unix(0, 1)}}, // as the client: a bad number reads 0
		{"$JS.ACK.INTENTS.ledger.3.1234.99.1", false, ackMeta{}},                           // too few tokens
		{"$JS.ACK.b.INTENTS.ledger.3.1234.99.1.17", false, ackMeta{}},                      // 10 tokens: neither form
		{"_INBOX.abc.def", false, ackMeta{}},
		{"", false, ackMeta{}},
	} {
		got, ok := parseAckReply(c.reply)
		if ok != c.ok || got.delivered != c.want.delivered || got.streamSeq != c.want.streamSeq || !got.stored.Equal(c.want.stored) {
			t.Errorf("parseAckReply(%q) = %+v, %v; want %+v, %v", c.reply, got, ok, c.want, c.ok)
		}
	}
}

func BenchmarkParseAckReply(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := parseAckReply("$JS.ACK.INTENTS.ledger.3.1234.99.1700000000123456789.17"); !ok {
			b.Fatal("not parsed")
		}
	}
}
