// A processor that tells when its connections are warm.

package bench

import (
	"context"
	"sync"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// warmSignal is a processor whose Warm closes done when it returns. A
// consumer is ready (pulling) while it still opens and prepares its
// connections, so that a restarted worker pulls at once; a phase that
// measures a running service's latency starts its clock once they are
// open, or its first batches wait for connections being made.
type warmSignal struct {
	jsinbox.BatchProcessor
	done chan struct{}
	once sync.Once
}

func newWarmSignal(p jsinbox.BatchProcessor) *warmSignal {
	return &warmSignal{BatchProcessor: p, done: make(chan struct{})}
}

// Warm implements jsinbox.BatchProcessor.
func (w *warmSignal) Warm(ctx context.Context, n int) error {
	defer w.once.Do(func() { close(w.done) })
	return w.BatchProcessor.Warm(ctx, n)
}

// Check implements jsinbox.Checker as the processor does, or with its
// Ping if it has no Check (as the consumer would).
func (w *warmSignal) Check(ctx context.Context) error {
	if c, ok := w.BatchProcessor.(jsinbox.Checker); ok {
		return c.Check(ctx)
	}
	return w.BatchProcessor.Ping(ctx)
}

// StoreName is the processor's, for the consumer's log line.
func (w *warmSignal) StoreName() string {
	if n, ok := w.BatchProcessor.(interface{ StoreName() string }); ok {
		return n.StoreName()
	}
	return ""
}

// warmed reports whether Warm has returned.
func (w *warmSignal) warmed() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}
