package jsinboxtest

import (
	"context"
	"testing"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
)

// TestStreamUsage: the consumer reads how full its intents, dead-letter and
// advisory streams are from the server, by messages or bytes, whichever is
// closer to its limit, and leaves out a stream that does not exist.
func TestStreamUsage(t *testing.T) {
	e := newEnv(t, "", jsinbox.StreamConfig{MaxMsgs: 100, DeadLetterMaxMsgs: 10, DeadLetterMaxBytes: 1 << 20})
	ctx := context.Background()
	e.publish(t, pipeline.Generate(pipeline.Load{Count: 80, Accounts: accounts, Prefix: "u"}))
	for i := range 3 {
		e.publishRaw(t, jsinbox.DeadLetterPrefix+"intents.x", string(rune('a'+i)), []byte("{}"))
	}
	proc, err := inbox.NewProcessor(pginbox.New(e.pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := jsinbox.NewConsumer(e.js, proc, jsinbox.ConsumerConfig{Durable: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.StreamUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fill := map[string]float64{}
	for _, u := range got {
		fill[u.Stream] = u.Fill()
	}
	dlq, adv := jsinbox.DeadLetterStream(jsinbox.DefaultStream), jsinbox.AdvisoryStream(jsinbox.DefaultStream)
	if len(got) != 3 || fill[jsinbox.DefaultStream] != 0.8 || fill[dlq] != 0.3 || fill[adv] != 0 {
		t.Fatalf("usage %+v: fill %v, want %s 0.8, %s 0.3, %s 0", got, fill, jsinbox.DefaultStream, dlq, adv)
	}

	if err := e.js.DeleteStream(ctx, adv); err != nil {
		t.Fatal(err)
	}
	if got, err = c.StreamUsage(ctx); err != nil || len(got) != 2 {
		t.Fatalf("without the advisory stream: %+v, %v; want the other two", got, err)
	}
}

// TestStreamUsageFill: bytes count when they are closer to their limit than
// messages; a stream without limits is never full.
func TestStreamUsageFill(t *testing.T) {
	for _, c := range []struct {
		u    jsinbox.StreamUsage
		want float64
	}{
		{jsinbox.StreamUsage{Msgs: 10, MaxMsgs: 100, Bytes: 900, MaxBytes: 1000}, 0.9},
		{jsinbox.StreamUsage{Msgs: 50, MaxMsgs: 100, Bytes: 900}, 0.5},
		{jsinbox.StreamUsage{Msgs: 50, Bytes: 900, MaxMsgs: -1, MaxBytes: -1}, 0},
	} {
		if got := c.u.Fill(); got != c.want {
			t.Errorf("%+v: Fill() = %v, want %v", c.u, got, c.want)
		}
	}
}
