package jsinbox

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracerName names the instrumentation scope of this package's spans.
const tracerName = "github.com/jetinbox/jetinbox/inbox/jsinbox"

// propagator carries W3C trace context in NATS headers.
var propagator = propagation.TraceContext{}

// headerCarrier adapts nats.Header to propagation.TextMapCarrier. NATS
// headers are case-sensitive; like other NATS clients it writes the W3C
// names in lower case ("traceparent", "tracestate") and reads either case.
type headerCarrier nats.Header

func (h headerCarrier) Get(key string) string {
	if v := nats.Header(h)[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

func (h headerCarrier) Set(key, value string) { nats.Header(h)[strings.ToLower(key)] = []string{value} }

func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

func tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(tracerName)
}

// injectTrace writes ctx's span context into h, if there is one.
func injectTrace(ctx context.Context, h nats.Header) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		propagator.Inject(ctx, headerCarrier(h))
	}
}

// extractLink returns a link to the producer's span carried in h, if any.
func extractLink(h nats.Header) (trace.Link, bool) {
	if len(h) == 0 {
		return trace.Link{}, false
	}
	sc := trace.SpanContextFromContext(propagator.Extract(context.Background(), headerCarrier(h)))
	return trace.Link{SpanContext: sc}, sc.IsValid()
}
