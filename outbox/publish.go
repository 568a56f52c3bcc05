package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/hook"
)

// PublishMode is how a relay's round publishes the rows it took.
type PublishMode int

const (
	// PublishAtomic sends a round's rows as JetStream atomic batches of up
	// to 1,000 (see [jsinbox.Publisher.PublishAll]): the stream stores
	// each batch with one write and answers it with one PubAck, and each
	// row is marked by its own outcome. A batch the stream refuses as a
	// whole (a row it already holds, one another stream captures, a lost
	// PubAck) is published again row by row with the same IDs. Where the
	// stream fsyncs every write (sync_interval: always, as deploy/ runs
	// NATS) this drained about twice the rows/s of PublishEach in
	// `jetinbox bench -relay`, and ten times one publish per row; on a
	// stream that does not, the gain is smaller and less steady, and one
	// publish per row can be as fast. The stream should allow atomic
	// publishing (jsinbox.StreamConfig sets allow_atomic); one that does
	// not refuses the first batch, and the relay's publisher publishes one
	// row at a time from then on. The default.
	PublishAtomic PublishMode = iota
	// PublishEach hands each row to the publisher on its own, which
	// pipelines the publishes and gathers what arrives together into
	// atomic batches of up to [RelayConfig].Publisher.Batch (1 turns that
	// off: one publish and one PubAck per row).
	PublishEach
	// PublishFast sends a round's rows as one JetStream fast batch
	// (nats-server 2.14 and later; the stream needs allow_batched): the
	// rows go out back to back without staging, and the server answers
	// with flow acknowledgements and a last PubAck that each say "every
	// row up to this one is stored". Rows are marked sent only up to that
	// row; the rows after it (a gap, a refused row, a lost or late answer,
	// a leader change) go again in the same round as atomic batches with
	// the same IDs, each settled by its own outcome. A row whose ID the
	// stream already holds is dropped by the stream and counted as stored,
	// without comparing payloads: an ID held with another payload is not
	// detected (PublishAtomic reports it as [inbox.ErrConflict]), and
	// [RelayStats].Duplicates does not count these rows, and a row sent in
	// a fast batch carries no trace context (RelayConfig.TracerProvider
	// traces the rows that go as atomic batches). A stream that does not
	// allow fast batches refuses the first one; the relay says so once in
	// its log and publishes as PublishAtomic from then on. Where the stream
	// fsyncs every write (sync_interval: always) the server fsyncs each row
	// of a fast batch on its own: there this mode drained a tenth of
	// PublishAtomic's rows/s in `jetinbox bench -relay`, and over twice
	// PublishEach's on a stream that does not.
	PublishFast
)

// String returns "atomic", "each" or "fast".
func (m PublishMode) String() string {
	switch m {
	case PublishAtomic:
		return "atomic"
	case PublishEach:
		return "each"
	case PublishFast:
		return "fast"
	}
	return fmt.Sprintf("PublishMode(%d)", int(m))
}

// ParsePublishMode parses "atomic", "each" or "fast".
func ParsePublishMode(s string) (PublishMode, error) {
	switch strings.ToLower(s) {
	case "atomic":
		return PublishAtomic, nil
	case "each":
		return PublishEach, nil
	case "fast":
		return PublishFast, nil
	}
	return 0, fmt.Errorf("outbox: publish mode %q: want atomic, each or fast", s)
}

// outcome is what a round's publishes came to, row by row: the rows
// refused for good (with the reason), the rows not acknowledged (they stay
// pending), and how many the stream already held. Every other row was
// acknowledged and is marked sent.
type outcome struct {
	refused    map[string]string
	unsent     map[string]bool
	duplicates int64
	// renew: the publisher's list of failures has grown long.
	renew bool
}

// refusedForGood reports an error that retrying cannot fix: the row is
// marked failed.
func refusedForGood(err error) bool {
	return errors.Is(err, inbox.ErrConflict) || errors.Is(err, jsinbox.ErrWrongStream) || errors.Is(err, inbox.ErrBadIntent)
}

// publishAll is PublishAtomic: the round's rows as atomic batches, each row
// settled by its own result.
func (r *Relay) publishAll(ctx context.Context, pub *jsinbox.Publisher, batch []inbox.Intent) (outcome, error) {
	sent := pub.PublishAll(ctx, batch)
	if r.fires(hook.RelayPubAckWait) {
		// The process dies with publishes in flight: some stored, some
		// not, none marked.
		if err := r.renewPublisher(); err != nil {
			return outcome{}, err
		}
		return outcome{}, &hook.Crash{Point: hook.RelayPubAckWait}
	}
	return settleAll(ctx, batch, sent)
}

// settleAll waits for the outcome of each row PublishAll sent.
func settleAll(ctx context.Context, batch []inbox.Intent, sent *jsinbox.Sent) (outcome, error) {
	res := sent.Wait(ctx)
	if err := ctx.Err(); err != nil {
		return outcome{}, fmt.Errorf("outbox: relay: waiting for PubAcks: %w", err)
	}
	out := outcome{refused: map[string]string{}, unsent: map[string]bool{}}
	for i, x := range res {
		id := batch[i].ID
		switch {
		case x.Err == nil:
			if x.Ack.Duplicate {
				out.duplicates++
			}
		case refusedForGood(x.Err):
			out.refused[id] = x.Err.Error()
		default:
			out.unsent[id] = true
		}
	}
	return out, nil
}

// publishEach is PublishEach: each row handed to the publisher on its own,
// its outcome read from the publisher's failures.
func (r *Relay) publishEach(ctx context.Context, pub *jsinbox.Publisher, batch []inbox.Intent) (outcome, error) {
	before := len(pub.Failures())
	dupBefore := pub.Stats().Duplicates
	out := outcome{refused: map[string]string{}, unsent: map[string]bool{}}
	for _, in := range batch {
		if err := pub.PublishAsync(ctx, in); err != nil {
			if errors.Is(err, inbox.ErrBadIntent) {
				out.refused[in.ID] = err.Error()
				continue
			}
			return outcome{}, fmt.Errorf("outbox: relay: publish: %w", err)
		}
	}
	if r.fires(hook.RelayPubAckWait) {
		if err := r.renewPublisher(); err != nil {
			return outcome{}, err
		}
		return outcome{}, &hook.Crash{Point: hook.RelayPubAckWait}
	}
	if err := pub.Flush(ctx); err != nil {
		return outcome{}, fmt.Errorf("outbox: relay: waiting for PubAcks: %w", err)
	}
	failures := pub.Failures()
	for _, f := range failures[before:] {
		if errors.Is(f.Err, inbox.ErrConflict) || errors.Is(f.Err, jsinbox.ErrWrongStream) {
			out.refused[f.ID] = f.Err.Error()
			continue
		}
		out.unsent[f.ID] = true
	}
	out.duplicates = pub.Stats().Duplicates - dupBefore
	out.renew = len(failures) > 10_000
	return out, nil
}
