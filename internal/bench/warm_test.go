package bench

import (
	"context"
	"errors"
	"testing"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// checkingProc is a processor with a Check of its own; only the methods
// the test calls are given.
type checkingProc struct {
	jsinbox.BatchProcessor
	checkErr error
}

func (p checkingProc) Warm(context.Context, int) error { return nil }
func (p checkingProc) Check(context.Context) error     { return p.checkErr }
func (p checkingProc) StoreName() string               { return "pginbox.Store" }

// TestWarmSignal: the wrapper says warmed only once Warm returned, and
// keeps the processor's Check (a consumer on a processor without one only
// pings) and store name.
func TestWarmSignal(t *testing.T) {
	unfit := errors.New("unfit")
	w := newWarmSignal(checkingProc{checkErr: unfit})
	if w.warmed() {
		t.Fatal("warmed before Warm")
	}
	if err := w.Warm(context.Background(), 2); err != nil || !w.warmed() {
		t.Fatalf("after Warm: err %v, warmed %v", err, w.warmed())
	}
	if err := w.Warm(context.Background(), 2); err != nil {
		t.Fatalf("second Warm: %v", err)
	}
	var c jsinbox.Checker = w
	if err := c.Check(context.Background()); !errors.Is(err, unfit) {
		t.Errorf("Check = %v, want the processor's", err)
	}
	if w.StoreName() != "pginbox.Store" {
		t.Errorf("StoreName = %q", w.StoreName())
	}
}
