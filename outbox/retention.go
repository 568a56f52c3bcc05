package outbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
)

// PruneOptions configures a store's Prune.
type PruneOptions struct {
	// OlderThan deletes sent rows created more than this long ago, by
	// the clock created_at was written with (PostgreSQL's now(), or the
	// SQLite writer's machine). It must be strictly longer than ReplayHorizon + Margin.
	// Required.
	OlderThan time.Duration
	// ReplayHorizon is the longest time after a row was written that the
	// same work can run again and add the same ID: for follow-ups, the
	// horizon of the stream their parents come from (the inbox's, see
	// inbox.PruneOptions); for a service's own writes, how long it may
	// retry a request. A row pruned inside it lets a repeat be added, and
	// published, again. Required.
	ReplayHorizon time.Duration
	// Margin is added to ReplayHorizon before comparing. Default
	// [inbox.DefaultPruneMargin].
	Margin time.Duration
	// BatchSize is how many rows one DELETE removes. Default 10000.
	BatchSize int
}

// Checked returns o with its defaults filled in (Margin, BatchSize), or
// what a store's Prune refuses: no ReplayHorizon, or an OlderThan that is
// not strictly longer than ReplayHorizon + Margin (an error wrapping
// [inbox.ErrUnsafeHorizon]). Every store checks its options with it, as
// [inbox.PruneOptions.Checked] does for the inbox.
func (o PruneOptions) Checked() (PruneOptions, error) {
	if o.ReplayHorizon <= 0 {
		return o, errors.New("outbox: prune: ReplayHorizon is required (how long the same work can add the same ID again)")
	}
	if o.Margin <= 0 {
		o.Margin = inbox.DefaultPruneMargin
	}
	if least := o.ReplayHorizon + o.Margin; o.OlderThan <= least || least < o.ReplayHorizon {
		return o, fmt.Errorf("outbox: prune: %w: OlderThan %v is not longer than ReplayHorizon %v + margin %v", inbox.ErrUnsafeHorizon, o.OlderThan, o.ReplayHorizon, o.Margin)
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 10000
	}
	return o, nil
}
