package shard

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

type warmCounter struct {
	jsinbox.BatchProcessor
	n atomic.Int32
}

func (w *warmCounter) Warm(context.Context, int) error { w.n.Add(1); return nil }

// TestWarmOncePerShard: the partition consumers of a shard share one pool;
// only the first warms it, so that none holds a connection waiting for
// another while the rest do the same.
func TestWarmOncePerShard(t *testing.T) {
	m := (&Map{}).WithDefaults()
	inner := &warmCounter{}
	p := NewProcessor(inner, &m)
	var wg sync.WaitGroup
	for range m.Partitions {
		wg.Go(func() { _ = p.Warm(context.Background(), 2) })
	}
	wg.Wait()
	if got := inner.n.Load(); got != 1 {
		t.Fatalf("%d partition consumers warmed the shard's pool %d times, want once", m.Partitions, got)
	}
}
