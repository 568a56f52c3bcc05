package inbox

import (
	"errors"
	"fmt"
	"time"
)

// DefaultPruneMargin is how much longer than the replay horizon a store's Prune
// requires OlderThan to be, by default. It absorbs what the horizon's
// arithmetic cannot see: the skew between the clocks the horizon's parts
// run on (the NATS servers' for MaxAge and the duplicate window,
// PostgreSQL's for received_at and the cut-off), the time a batch spends
// between delivery and commit, and the prune's own running time.
const DefaultPruneMargin = time.Hour

// PruneOptions configures a store's Prune.
type PruneOptions struct {
	// Scope limits pruning to one scope. Default "": every scope.
	Scope string
	// OlderThan deletes rows received more than this long ago, by
	// PostgreSQL's clock: received_at comes from its now(), and so does the
	// cut-off. It must be strictly longer than ReplayHorizon + Margin.
	// Required.
	OlderThan time.Duration
	// ReplayHorizon is the longest time after an inbox row was written that
	// its message ID can still reach the inbox: stream MaxAge, redeliveries
	// (MaxDeliver × (AckWait + longest nak delay)), late copies after the
	// duplicate window, dead-letter re-drives. A row pruned inside it would
	// let a message come back and apply its effect twice. Required.
	ReplayHorizon time.Duration
	// Margin is added to ReplayHorizon before comparing. Default
	// [DefaultPruneMargin].
	Margin time.Duration
	// BatchSize is how many rows one DELETE removes, keeping locks and WAL
	// bursts small. Default 10000.
	BatchSize int
}

// Checked returns o with its defaults filled in, or [ErrUnsafeHorizon]
// unless OlderThan is strictly longer than ReplayHorizon + Margin. Every
// store's prune checks its options with it.
func (o PruneOptions) Checked() (PruneOptions, error) {
	if o.ReplayHorizon <= 0 {
		return o, errors.New("inbox: prune: ReplayHorizon is required (stream MaxAge, redeliveries, late copies, re-drives)")
	}
	if o.Margin <= 0 {
		o.Margin = DefaultPruneMargin
	}
	if least := o.ReplayHorizon + o.Margin; o.OlderThan <= least || least < o.ReplayHorizon {
		return o, fmt.Errorf("%w: OlderThan %v is not longer than ReplayHorizon %v + margin %v", ErrUnsafeHorizon, o.OlderThan, o.ReplayHorizon, o.Margin)
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 10000
	}
	return o, nil
}
