package jsinboxtest

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// TestTraceContextCarried: the producer's span context travels in lowercase
// traceparent headers, and each consumer batch span links to the producers'
// spans, with claim, effect, commit and ack spans inside it.
func TestTraceContextCarried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	e := newEnv(t, "", jsinbox.StreamConfig{})
	pub, err := jsinbox.NewPublisher(e.js, jsinbox.PublisherConfig{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, in := range load(20, "tr") {
		if err := pub.PublishAsync(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	msgs, err := verify.ReadStream(ctx, e.js, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if msgs[0].Header["traceparent"] == "" {
		t.Fatalf("no lowercase traceparent header: %v", msgs[0].Header)
	}
	proc, _ := inbox.NewProcessor(pginbox.New(e.pool), effects.NewLedger(), inbox.Config{Scope: "ledger", TracerProvider: tp})
	c, _ := jsinbox.NewConsumer(e.js, proc, jsinbox.ConsumerConfig{})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	e.settle(t, 30*time.Second)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	published := map[string]bool{}
	names := map[string]int{}
	linked := 0
	for _, s := range rec.Ended() {
		names[s.Name()]++
		if s.Name() == "jetinbox.publish" {
			published[s.SpanContext().SpanID().String()] = true
		}
	}
	for _, s := range rec.Ended() {
		if s.Name() != "jetinbox.batch" {
			continue
		}
		for _, l := range s.Links() {
			if published[l.SpanContext.SpanID().String()] {
				linked++
			}
		}
	}
	for _, n := range []string{"jetinbox.publish", "jetinbox.batch", "jetinbox.fetch", "jetinbox.claim", "jetinbox.effect", "jetinbox.commit", "jetinbox.ack"} {
		if names[n] == 0 {
			t.Errorf("no %s span (spans: %v)", n, names)
		}
	}
	if names["jetinbox.publish"] != 20 || linked != 20 {
		t.Fatalf("%d publish spans, %d linked from batch spans; want 20 and 20", names["jetinbox.publish"], linked)
	}
}
