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

// CheckPrune fills the defaults of opts (Margin, BatchSize) and refuses
// what a store's Prune refuses: no ReplayHorizon, or an OlderThan that is not
// strictly longer than ReplayHorizon + Margin (an error wrapping
// [inbox.ErrUnsafeHorizon]). Every store calls it before deleting.
func CheckPrune(opts *PruneOptions) error {
	if opts.ReplayHorizon <= 0 {
		return errors.New("outbox: prune: ReplayHorizon is required (how long the same work can add the same ID again)")
	}
	if opts.Margin <= 0 {
		opts.Margin = inbox.DefaultPruneMargin
	}
	if least := opts.ReplayHorizon + opts.Margin; opts.OlderThan <= least || least < opts.ReplayHorizon {
		return fmt.Errorf("outbox: prune: %w: OlderThan %v is not longer than ReplayHorizon %v + margin %v", inbox.ErrUnsafeHorizon, opts.OlderThan, opts.ReplayHorizon, opts.Margin)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 10000
	}
	return nil
}
