package outbox

import (
	"context"
	"errors"

	"github.com/jetinbox/jetinbox/internal/hook"
)

// overlaps reports whether a backlog's rounds overlap: a round's marks
// with the next round's take and publish. Only with PublishAtomic and
// PublishFast, whose rounds share nothing of the publisher's but its
// connection.
func (r *Relay) overlaps() bool {
	return (r.cfg.Publish == PublishAtomic || r.cfg.Publish == PublishFast) && !r.cfg.Sequential
}

// Drain runs rounds until one takes fewer than Batch rows, and returns how
// many rows that last round took. With PublishAtomic or PublishFast (unless Sequential is
// set) a round marks and commits its rows while the next round takes and
// publishes its own: rows a round holds are locked until its commit, so
// the next round takes others, and a round publishes only after the one
// before it has all its PubAcks, so rows still go out in the order taken.
// An error ends the drain once the round marking has finished: a round
// published and not marked is left pending, to be sent again with the same
// IDs (the stream drops the copy inside its duplicate window). Run drains
// while rounds come back full; call Drain directly in a one-off job or a
// test, never at the same time as Run or Round of the same relay.
func (r *Relay) Drain(ctx context.Context) (int, error) {
	if !r.overlaps() {
		for {
			n, err := r.Round(ctx)
			if err != nil || n < r.cfg.Batch {
				return n, err
			}
		}
	}
	bg := context.WithoutCancel(ctx)
	var marked chan error
	wait := func() error {
		if marked == nil {
			return nil
		}
		err := <-marked
		marked = nil
		return err
	}
	for {
		rd, err := r.send(ctx)
		merr := wait()
		var crash *hook.Crash
		if errors.As(merr, &crash) {
			// The process died while marking: what this round
			// published stays unmarked, as a dead process leaves it.
			if rd != nil {
				rd.taken.Abandon(bg)
			}
			return 0, merr
		}
		if rd == nil {
			return 0, errors.Join(err, merr)
		}
		n := len(rd.batch)
		if err == nil {
			if merr != nil {
				// The round before failed to mark (its rows stay
				// pending); this one's publishes are in: mark them.
				err = r.mark(ctx, rd)
			} else {
				marked = make(chan error, 1)
				go func(rd *round) {
					err := r.mark(ctx, rd)
					rd.taken.Abandon(bg) // after Finish this does nothing
					marked <- err
				}(rd)
				if n >= r.cfg.Batch {
					continue
				}
				return n, wait()
			}
		}
		rd.taken.Abandon(bg)
		return n, errors.Join(err, merr)
	}
}
