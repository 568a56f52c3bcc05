package verify_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// verify reads with direct gets in batches: every message of a range, in
// order, across batch boundaries, with the stored headers and none that the
// direct get adds.
func TestReadRangeInBatches(t *testing.T) {
	ctx := context.Background()
	e := pipelinetest.New(t, jsinbox.StreamConfig{}, 1)
	const n = 2345
	for i := 1; i <= n; i++ {
		if _, err := e.JS.PublishAsync("intents.r", fmt.Appendf(nil, `{"n":%d}`, i), jetstream.WithMsgID(fmt.Sprint("r-", i))); err != nil {
			t.Fatal(err)
		}
	}
	<-e.JS.PublishAsyncComplete()
	for _, rg := range []verify.Range{{}, {FromSeq: 999, ToSeq: 2001}, {FromSeq: 1000}, {ToSeq: 1}, {FromSeq: n, ToSeq: n + 10}} {
		msgs, err := verify.ReadRange(ctx, e.JS, jsinbox.DefaultStream, rg, nil)
		if err != nil {
			t.Fatalf("%+v: %v", rg, err)
		}
		from, to := max(rg.FromSeq, 1), uint64(n)
		if rg.ToSeq > 0 {
			to = min(rg.ToSeq, n)
		}
		if uint64(len(msgs)) != to-from+1 {
			t.Fatalf("%+v: read %d messages, want %d", rg, len(msgs), to-from+1)
		}
		for i, m := range msgs {
			seq := from + uint64(i)
			if m.Seq != seq || m.ID != fmt.Sprint("r-", seq) || string(m.Payload) != fmt.Sprintf(`{"n":%d}`, seq) {
				t.Fatalf("%+v: message %d is %d %q %s", rg, i, m.Seq, m.ID, m.Payload)
			}
			for k := range m.Header {
				if k != jetstream.MsgIDHeader {
					t.Fatalf("%+v: message %d carries header %s: %v", rg, seq, k, m.Header)
				}
			}
		}
	}
}

// A stream made before the streams allowed direct gets is named, with the
// setting to change, instead of a read that waits for nothing.
func TestVerifyNeedsDirectGets(t *testing.T) {
	ctx := context.Background()
	js, pool := settledPipeline(t, 10)
	s, err := js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	_, err = verify.Run(ctx, js, pool, verify.Options{Scope: "ledger", Durable: "ledger"})
	if !errors.Is(err, verify.ErrNoDirectGet) || !strings.Contains(err.Error(), "allow_direct") || !strings.Contains(err.Error(), jsinbox.DefaultStream) {
		t.Fatalf("verify on a stream without direct gets: %v", err)
	}
	t.Log(err)
}
