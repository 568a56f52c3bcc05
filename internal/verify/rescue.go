// Give-ups awaiting rescue: messages the server gave up on whose
// max-deliveries advisory the rescue has not settled yet.

package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// maxDeliverType is the type of the server's max-deliveries advisory.
const maxDeliverType = "io.nats.jetstream.advisory.v1.max_deliver"

// awaiting is what verify knows of the rescues under way.
type awaiting struct {
	// seqs: the stream sequences named by an advisory the rescue durable
	// has not settled (above its ack floor), with when the server gave up.
	seqs map[uint64]time.Time
	// backlog: the rescue durable's unsettled advisories (pending and
	// unacked); 0 when there is no rescue durable.
	backlog uint64
	// unread says why the advisories could not be read ("" if they were).
	unread string
}

// readAwaiting reads the max-deliveries advisories of durable the rescue
// durable of the same name has not settled: those above its ack floor in
// the advisory stream (all of them if no consumer made it yet) (read with direct gets, as verify reads every
// stream). An advisory at or below the floor is settled: the rescue acks
// one only once its message is applied or found applied, dead-lettered,
// recorded as expired, or the advisory refused as foreign. Only genuine
// advisories of this stream and durable count (no headers of a stored
// message, the server's type, this stream and durable, a sequence); a
// forged one cannot hide a lost message for longer than the rescue takes
// to refuse it, which moves the floor past it.
func readAwaiting(ctx context.Context, js jetstream.JetStream, stream, durable string) (awaiting, error) {
	aw := awaiting{seqs: map[uint64]time.Time{}}
	if durable == "" {
		return aw, nil
	}
	name := jsinbox.AdvisoryStream(stream)
	var floor uint64
	c, err := js.Consumer(ctx, name, durable)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return aw, nil // no advisory stream: nothing to rescue
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		// No consumer has run since the server gave up on them: the
		// first one makes the rescue durable and rescues them all.
		s, err := js.Stream(ctx, name)
		if err != nil {
			aw.unread = fmt.Sprintf("advisory stream %s: %v", name, err)
			return aw, nil
		}
		aw.backlog = s.CachedInfo().State.Msgs
	case err != nil:
		aw.unread = fmt.Sprintf("rescue durable %s on %s: %v", durable, name, err)
		return aw, nil
	default:
		info := c.CachedInfo()
		aw.backlog = info.NumPending + uint64(info.NumAckPending)
		floor = info.AckFloor.Stream
	}
	if aw.backlog == 0 {
		return aw, nil
	}
	subject := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + durable
	_, err = walkRange(ctx, js, name, Range{FromSeq: floor + 1}, 1000, nil, func(chunk []Message) error {
		for _, m := range chunk {
			if m.Subject != subject || m.ID != "" {
				continue
			}
			if _, ok := m.Header[jetstream.StreamHeader]; ok {
				continue
			}
			if _, ok := m.Header[jetstream.SequenceHeader]; ok {
				continue
			}
			var a struct {
				Type      string    `json:"type"`
				Stream    string    `json:"stream"`
				Consumer  string    `json:"consumer"`
				StreamSeq uint64    `json:"stream_seq"`
				Time      time.Time `json:"timestamp"`
			}
			if json.Unmarshal(m.Payload, &a) != nil || a.Type != maxDeliverType || a.Stream != stream || a.Consumer != durable || a.StreamSeq == 0 {
				continue
			}
			if t, ok := aw.seqs[a.StreamSeq]; !ok || a.Time.Before(t) {
				aw.seqs[a.StreamSeq] = a.Time
			}
		}
		return nil
	})
	if err != nil {
		aw.unread = fmt.Sprintf("advisories above the ack floor of rescue durable %s could not be read from %s: %v", durable, name, err)
		aw.seqs = map[uint64]time.Time{}
	}
	return aw, ctx.Err()
}

// awaitingWarning says what the messages awaiting rescue mean, and when
// they have waited too long.
func (r *Report) awaitingWarning(aw awaiting, stream string) {
	if aw.unread != "" && aw.backlog > 0 {
		r.Warnings = append(r.Warnings, fmt.Sprintf("%d max-deliveries advisories await rescue, but which messages they name is unknown (%s): "+
			"messages counted lost may be among them; run verify again once jetinbox_rescue_backlog is 0", aw.backlog, aw.unread))
	}
	if r.AwaitingRescue == 0 {
		return
	}
	age := time.Since(r.AwaitingRescueSince).Round(time.Second)
	w := fmt.Sprintf("%d messages of %s the server gave up on await their rescue (the oldest given up on %s ago): not violations while a consumer rescues them "+
		"(it settles thousands a second); run verify again once jetinbox_rescue_backlog is 0", r.AwaitingRescue, stream, age)
	if age > AwaitingRescueTooLong {
		w += fmt.Sprintf(". Longer than %s is too long: no consumer runs, or its rescue cannot settle (database down, dead-letter stream refusing; see its log and /readyz)", AwaitingRescueTooLong)
	}
	r.Warnings = append(r.Warnings, w)
}

// AwaitingRescueTooLong is how long a message may await its rescue before
// verify's warning says something is wrong: a running consumer rescues a
// backlog of thousands in seconds, and tries one that fails again within
// its nak delays.
const AwaitingRescueTooLong = 15 * time.Minute
