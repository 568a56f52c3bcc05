// Give-ups awaiting rescue: messages the server gave up on whose
// max-deliveries advisory the rescue has not settled yet.

package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
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
// the advisory stream (all of them if no consumer made it yet), read with
// direct gets, as verify reads every stream. An advisory at or below the
// floor is settled: the rescue acks one only once its message is applied
// or found applied, dead-lettered, recorded as expired, or the advisory
// refused as foreign. Only genuine advisories of this stream and durable
// count (no headers of a stored message, the server's type, this stream
// and durable, a sequence); a forged one cannot hide a lost message for
// longer than the rescue takes to refuse it, which moves the floor past
// it.
func readAwaiting(ctx context.Context, js jetstream.JetStream, stream, durable string) (awaiting, error) {
	if durable == "" {
		return awaiting{seqs: map[uint64]time.Time{}}, nil
	}
	return readAwaitingOf(ctx, js, stream, []string{durable})
}

// readAwaitingOf is [readAwaiting] for several durables of one stream (the
// partition durables of a sharded stream, whose advisories share one
// advisory stream), read in one pass from the lowest ack floor: the
// sequences their advisories name together, their backlogs summed.
func readAwaitingOf(ctx context.Context, js jetstream.JetStream, stream string, durables []string) (awaiting, error) {
	aw := awaiting{seqs: map[uint64]time.Time{}}
	name := jsinbox.AdvisoryStream(stream)
	// floors: the durables with advisories to read, by ack floor.
	floors := make(map[string]uint64, len(durables))
	var unread []string
	for i, durable := range durables {
		c, err := js.Consumer(ctx, name, durable)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return aw, ctx.Err() // no advisory stream: nothing to rescue
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			// No consumer has run since the server gave up on them: the
			// first one makes the rescue durable and rescues them all.
			var info *jetstream.StreamInfo
			s, err := js.Stream(ctx, name)
			if err == nil {
				info, err = s.Info(ctx, jetstream.WithSubjectFilter(advisorySubject(stream, durable)))
			}
			if err != nil {
				unread = append(unread, fmt.Sprintf("advisory stream %s: %v", name, err))
				continue
			}
			if n := info.State.Subjects[advisorySubject(stream, durable)]; n > 0 {
				aw.backlog += n
				floors[durable] = 0
			}
		case err != nil:
			unread = append(unread, fmt.Sprintf("rescue durable %s on %s: %v", durable, name, err))
			if rest := len(durables) - i - 1; rest > 0 {
				// A lookup that fails (refused, timed out) fails for the
				// others too, each after the client's timeout.
				unread = append(unread, fmt.Sprintf("%d more rescue durables not looked up", rest))
				aw.unread = strings.Join(unread, "; ")
				return aw, ctx.Err()
			}
		default:
			info := c.CachedInfo()
			if n := info.NumPending + uint64(info.NumAckPending); n > 0 {
				aw.backlog += n
				floors[durable] = info.AckFloor.Stream
			}
		}
	}
	aw.unread = strings.Join(unread, "; ")
	if len(floors) == 0 {
		return aw, ctx.Err()
	}
	from := uint64(math.MaxUint64)
	for _, f := range floors {
		from = min(from, f)
	}
	_, err := walkRange(ctx, js, name, Range{FromSeq: from + 1}, 1000, nil, func(chunk []Message) error {
		for _, m := range chunk {
			if m.ID != "" {
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
			if json.Unmarshal(m.Payload, &a) != nil || a.Type != maxDeliverType || a.Stream != stream || a.StreamSeq == 0 {
				continue
			}
			floor, ok := floors[a.Consumer]
			if !ok || m.Seq <= floor || m.Subject != advisorySubject(stream, a.Consumer) {
				continue
			}
			if t, ok := aw.seqs[a.StreamSeq]; !ok || a.Time.Before(t) {
				aw.seqs[a.StreamSeq] = a.Time
			}
		}
		return nil
	})
	if err != nil {
		u := fmt.Sprintf("advisories above the ack floors of the rescue durables could not be read from %s: %v", name, err)
		aw.unread = strings.Join(append(unread, u), "; ")
		aw.seqs = map[uint64]time.Time{}
	}
	return aw, ctx.Err()
}

// advisorySubject is the subject of durable's max-deliveries advisories.
func advisorySubject(stream, durable string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + durable
}

// awaitingWarning says what the messages awaiting rescue mean, and when
// they have waited too long.
func (r *Report) awaitingWarning(aw awaiting, stream string) {
	r.Warnings = append(r.Warnings, awaitingWarnings(aw, r.AwaitingRescue, r.AwaitingRescueSince, stream)...)
}

// awaitingWarnings are the warnings of n messages of stream awaiting
// their rescue, the oldest given up on at since, and of advisories that
// could not be read.
func awaitingWarnings(aw awaiting, n int, since time.Time, stream string) []string {
	var ws []string
	switch {
	case aw.unread != "" && aw.backlog > 0:
		ws = append(ws, fmt.Sprintf("%d max-deliveries advisories await rescue, but which messages they name is unknown (%s): "+
			"messages counted lost may be among them; run verify again once jetinbox_rescue_backlog is 0", aw.backlog, aw.unread))
	case aw.unread != "":
		ws = append(ws, fmt.Sprintf("whether max-deliveries advisories await rescue is unknown (%s): "+
			"messages counted lost may be among them; run verify again once jetinbox_rescue_backlog is 0", aw.unread))
	}
	if n == 0 {
		return ws
	}
	age := time.Since(since).Round(time.Second)
	w := fmt.Sprintf("%d messages of %s the server gave up on await their rescue (the oldest given up on %s ago): not violations while a consumer rescues them "+
		"(it settles thousands a second); run verify again once jetinbox_rescue_backlog is 0", n, stream, age)
	if age > AwaitingRescueTooLong {
		w += fmt.Sprintf(". Longer than %s is too long: no consumer runs, or its rescue cannot settle (database down, dead-letter stream refusing; see its log and /readyz)", AwaitingRescueTooLong)
	}
	return append(ws, w)
}

// AwaitingRescueTooLong is how long a message may await its rescue before
// verify's warning says something is wrong: a running consumer rescues a
// backlog of thousands in seconds, and tries one that fails again within
// its nak delays.
const AwaitingRescueTooLong = 15 * time.Minute
