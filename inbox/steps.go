// When a batch's transaction passed its steps: the finer split of
// publish-to-commit latency (jetinbox bench).

package inbox

import (
	"context"
	"time"
)

// StepTimes are when the last attempt at a batch passed each step of its
// transaction: BEGIN answered, the claim done, the effect's turn taken
// (EffectConcurrency batches hold one at a time, up to their COMMIT), the
// effect and the rejections recorded, COMMIT answered. A zero time is a
// step the attempt did not reach.
type StepTimes struct {
	Begun, Claimed, Turn, Applied, Committed time.Time
}

type stepsKey struct{}

// WithStepTimes returns a context under which [Processor.Process] records
// the steps of the batch's transaction in st. Process writes st on its
// own goroutine; read it after Process returned.
func WithStepTimes(ctx context.Context, st *StepTimes) context.Context {
	return context.WithValue(ctx, stepsKey{}, st)
}

// stepTimes returns the recorder ctx carries, or nil.
func stepTimes(ctx context.Context) *StepTimes {
	st, _ := ctx.Value(stepsKey{}).(*StepTimes)
	return st
}

type step uint8

const (
	stepBegun step = iota
	stepClaimed
	stepTurn
	stepApplied
	stepCommitted
)

// mark records that the batch passed step s now, if it is being timed.
func (st *StepTimes) mark(s step) {
	if st == nil {
		return
	}
	now := time.Now()
	switch s {
	case stepBegun:
		st.Begun = now
	case stepClaimed:
		st.Claimed = now
	case stepTurn:
		st.Turn = now
	case stepApplied:
		st.Applied = now
	case stepCommitted:
		st.Committed = now
	}
}
