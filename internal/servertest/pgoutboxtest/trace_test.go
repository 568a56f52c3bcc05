package pgoutboxtest

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jetinbox/jetinbox/outbox"
)

// TestRelayTakesItsOwnTracer: the relay's TracerProvider traces its
// publishes, as the processor's, the consumer's and the publisher's do:
// one field of the same name on every component, with no need to reach
// into RelayConfig.Publisher.
func TestRelayTakesItsOwnTracer(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	e := newEnv(t)
	e.add(t, "tr", 3)
	drain(t, quickRelay(t, e, outbox.RelayConfig{TracerProvider: tp}))
	n := 0
	for _, s := range rec.Ended() {
		if s.Name() == "jetinbox.publish" {
			n++
		}
	}
	if n < 3 {
		t.Fatalf("%d publish spans for 3 rows relayed with the relay's tracer", n)
	}
}
