package cli

import (
	"context"
	"fmt"
	"io"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// tracing returns a TracerProvider when tracing is configured, else nil
// (off): OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// exports OTLP over HTTP (the exporter reads the standard OTEL_* variables);
// JETINBOX_TRACE=stdout prints spans to stderr.
func tracing(ctx context.Context, env Env, service string, stderr io.Writer) (trace.TracerProvider, func(context.Context) error, error) {
	var exp sdktrace.SpanExporter
	var err error
	switch {
	case env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "":
		exp, err = otlptracehttp.New(ctx)
	case env("JETINBOX_TRACE") == "stdout":
		exp, err = stdouttrace.New(stdouttrace.WithWriter(stderr))
	case env("JETINBOX_TRACE") != "":
		return nil, nil, UsageError{Err: fmt.Errorf("JETINBOX_TRACE=%q: only \"stdout\" is known; set OTEL_EXPORTER_OTLP_ENDPOINT for OTLP", env("JETINBOX_TRACE"))}
	default:
		return nil, func(context.Context) error { return nil }, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))))
	return tp, tp.Shutdown, nil
}
