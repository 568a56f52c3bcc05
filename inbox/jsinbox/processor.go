package jsinbox

import (
	"context"
	"log/slog"
	"reflect"

	"go.opentelemetry.io/otel/trace"

	"github.com/jetinbox/jetinbox/inbox"
)

// BatchProcessor is what a [Consumer] needs of an inbox processor. An
// [inbox.Processor[pgx.Tx]] on any store is one: *inbox.Processor[pgx.Tx] on
// PostgreSQL, *inbox.Processor[*sql.Tx] on SQLite. The consumer takes
// from it everything else it needs of the database and of observability,
// so none of it is given twice.
type BatchProcessor interface {
	Process(ctx context.Context, msgs []inbox.Message) ([]inbox.Outcome, error)
	Scope() string
	Stats() inbox.ProcessorStats
	Warm(ctx context.Context, n int) error
	// Ping checks that the processor's database answers; the consumer
	// pauses while it fails, unless the processor is also a [Checker].
	Ping(ctx context.Context) error
	// Logger and TracerProvider are the processor's; the consumer logs
	// and traces with them.
	Logger() *slog.Logger
	TracerProvider() trace.TracerProvider
}

// Checker is a [BatchProcessor] that can run its store's check
// transaction, which fails where a batch would fail for the database's or
// the deployment's reason (see [inbox.Processor.Check]); an
// *inbox.Processor is one. A consumer on a Checker refuses to start on a
// database that cannot take batches as it is set up (unmigrated,
// read-only, behind a statement pooler, without a grant) and pauses while
// Check fails; on any other processor it only pings. A processor that
// wraps another forwards Check.
type Checker interface {
	Check(ctx context.Context) error
}

// check runs the processor's Check, or its Ping if it has none.
func check(ctx context.Context, p BatchProcessor) error {
	if c, ok := p.(Checker); ok {
		return c.Check(ctx)
	}
	return p.Ping(ctx)
}

// isNil reports whether p is nil or a nil pointer.
func isNil(p BatchProcessor) bool {
	if p == nil {
		return true
	}
	v := reflect.ValueOf(p)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
