package jsinbox

import (
	"context"
	"reflect"

	"github.com/jetinbox/jetinbox/inbox"
)

// BatchProcessor is what a [Consumer] needs of an inbox processor. An
// [inbox.ProcessorOf] on any store is one: *inbox.Processor on
// PostgreSQL, *inbox.ProcessorOf[*sql.Tx] on SQLite.
type BatchProcessor interface {
	Process(ctx context.Context, msgs []inbox.Message) ([]inbox.Outcome, error)
	Scope() string
	Stats() inbox.ProcessorStats
	Warm(ctx context.Context, n int) error
}

// isNil reports whether p is nil or a nil pointer.
func isNil(p BatchProcessor) bool {
	if p == nil {
		return true
	}
	v := reflect.ValueOf(p)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
