package outbox

import (
	"context"
	"fmt"
	"time"
)

// Row is a pending outbox row as a relay publishes it.
type Row struct {
	ID, Subject string
	Payload     []byte
}

// Source is the database a [Relay] takes pending rows from: the outbox
// store of package pgoutbox or sqliteoutbox, or one of the caller's own.
type Source interface {
	// Take takes up to n pending rows, oldest first, that no other relay
	// holds, and holds them until Finish or Abandon.
	Take(ctx context.Context, n int) (Taken, error)
}

// Taken is a batch of rows a relay holds.
type Taken interface {
	// Rows are the rows taken; none means there was nothing to send.
	Rows() []Row
	// Finish marks the rows of sent as sent and those of failed as
	// refused for good (with the reason), durably, in one step, and lets
	// go of the batch. It returns how long each sent row waited since it
	// was added. A source whose hold can lapse (a lease) marks only the
	// rows it still holds; if another relay has taken some over, Finish
	// commits the others and returns a *[NotHeldError] naming them.
	Finish(ctx context.Context, sent []string, failed map[string]string) ([]time.Duration, error)
	// Abandon lets go of the rows without marking anything: they are
	// pending again, except those another relay has taken over since,
	// which stay that relay's. After Finish it does nothing.
	Abandon(ctx context.Context)
}

// NotHeldError is returned by a [Taken]'s Finish that committed the marks of
// the rows it still held, and left alone the rows another relay took over
// after this relay's hold lapsed (the SQLite source's lease ran out): that
// relay publishes them again (duplicates the stream drops inside its
// window) and marks them.
type NotHeldError struct {
	// IDs are the rows of Finish's sent and failed that were not marked.
	IDs []string
}

// Error says how many rows were taken over.
func (e *NotHeldError) Error() string {
	if len(e.IDs) == 0 {
		return "no rows were taken over by another relay"
	}
	return fmt.Sprintf("%d rows were taken over by another relay before they were marked (first %s); that relay sends and marks them", len(e.IDs), e.IDs[0])
}

// Listener is implemented by a [Source] that can wake a relay when rows
// are added.
type Listener interface {
	Listen(ctx context.Context) (Waiter, error)
}

// Waiter waits for new rows.
type Waiter interface {
	// Wait returns nil when rows were added or d has passed, and an error
	// when the waiter broke (the relay then polls, and listens again
	// later).
	Wait(ctx context.Context, d time.Duration) error
	Close()
}
