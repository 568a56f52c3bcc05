// Reading a stream: the range to check, and its messages, read with an
// ordered consumer.

package verify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Range is a part of the stream, by sequence or time. Zero fields are open.
type Range struct {
	FromSeq, ToSeq   uint64
	FromTime, ToTime time.Time
}

// ErrBadRange is returned for a range that selects nothing by construction:
// reversed, or set by sequence and by time at once.
var ErrBadRange = errors.New("verify: bad range")

// Validate reports a reversed range (-from-seq after -to-seq, -from-time
// after -to-time) or a start given both by sequence and by time. A reversed
// range would read nothing and look clean.
func (r Range) Validate() error {
	switch {
	case r.FromSeq > 0 && r.ToSeq > 0 && r.FromSeq > r.ToSeq:
		return fmt.Errorf("%w: from sequence %d is after to sequence %d", ErrBadRange, r.FromSeq, r.ToSeq)
	case !r.FromTime.IsZero() && !r.ToTime.IsZero() && r.FromTime.After(r.ToTime):
		return fmt.Errorf("%w: from time %s is after to time %s", ErrBadRange, r.FromTime.Format(time.RFC3339), r.ToTime.Format(time.RFC3339))
	case r.FromSeq > 1 && !r.FromTime.IsZero():
		return fmt.Errorf("%w: start either by sequence or by time, not both", ErrBadRange)
	}
	return nil
}

// Partial reports whether the range selects a part of the stream rather
// than all of it.
func (r Range) Partial() bool { return r.partial() }

func (r Range) partial() bool {
	return r.FromSeq > 1 || r.ToSeq > 0 || !r.FromTime.IsZero() || !r.ToTime.IsZero()
}

// Message is one stream message as verify reads it.
type Message struct {
	Seq     uint64
	ID      string
	Payload []byte
	Header  map[string]string
}

// ReadStream reads every message currently in stream with an ordered
// consumer, which creates no durable state and disturbs no other consumer.
func ReadStream(ctx context.Context, js jetstream.JetStream, stream string) ([]Message, error) {
	return ReadRange(ctx, js, stream, Range{}, nil)
}

// ReadRange reads the messages of a range of stream, like ReadStream.
func ReadRange(ctx context.Context, js jetstream.JetStream, stream string, rg Range, progress func(read, total uint64)) ([]Message, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("verify: stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("verify: stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	if rg.ToSeq > 0 && rg.ToSeq < last {
		last = rg.ToSeq
	}
	out := make([]Message, 0, min(info.State.Msgs, 1<<20))
	if info.State.Msgs == 0 || last < max(rg.FromSeq, info.State.FirstSeq) {
		return out, nil
	}
	occ := jetstream.OrderedConsumerConfig{}
	switch {
	case rg.FromSeq > 1:
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, rg.FromSeq
	case !rg.FromTime.IsZero():
		occ.DeliverPolicy, occ.OptStartTime = jetstream.DeliverByStartTimePolicy, &rg.FromTime
	}
	oc, err := s.OrderedConsumer(ctx, occ)
	if err != nil {
		return nil, fmt.Errorf("verify: ordered consumer on %s: %w", stream, err)
	}
	for {
		batch, err := oc.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("verify: read %s: %w", stream, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("verify: read %s: %w", stream, err)
			}
			h := map[string]string{}
			for k, v := range m.Headers() {
				if len(v) > 0 {
					h[k] = v[0]
				}
			}
			if !rg.ToTime.IsZero() && md.Timestamp.After(rg.ToTime) {
				return out, nil
			}
			out = append(out, Message{Seq: md.Sequence.Stream, ID: h[jetstream.MsgIDHeader], Payload: m.Data(), Header: h})
			if progress != nil && len(out)%1000 == 0 {
				progress(md.Sequence.Stream, last)
			}
			if md.Sequence.Stream >= last {
				if progress != nil {
					progress(last, last)
				}
				return out, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("verify: read %s: %w", stream, err)
		}
		if n == 0 {
			return nil, fmt.Errorf("verify: read %s: stopped at %d of %d messages", stream, len(out), info.State.Msgs)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}
