// Reading a stream: the range to check, and its messages, read with an
// ordered consumer.

package verify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
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

// readStall is how long a stream read waits for the next message before it
// reports the read as stopped short.
const readStall = 30 * time.Second

// ReadStream reads every message currently in stream with an ordered
// consumer, which creates no durable state and disturbs no other consumer.
func ReadStream(ctx context.Context, js jetstream.JetStream, stream string) ([]Message, error) {
	return ReadRange(ctx, js, stream, Range{}, nil)
}

// ReadRange reads the messages of a range of stream, like ReadStream.
func ReadRange(ctx context.Context, js jetstream.JetStream, stream string, rg Range, progress func(read, total uint64)) ([]Message, error) {
	var out []Message
	_, err := walkRange(ctx, js, stream, rg, 1000, progress, func(chunk []Message) error {
		out = append(out, chunk...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = []Message{}
	}
	return out, nil
}

// walkRange reads a range of stream with an ordered consumer and hands it
// to fn in chunks of up to size messages, in stream order; a chunk is not
// used after fn returns. It returns the last sequence of the range as the
// stream stood when the walk began (ToSeq if earlier): no message after it
// is read.
func walkRange(ctx context.Context, js jetstream.JetStream, stream string, rg Range, size int, progress func(read, total uint64), fn func([]Message) error) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("verify: stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("verify: stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	if rg.ToSeq > 0 && rg.ToSeq < last {
		last = rg.ToSeq
	}
	if info.State.Msgs == 0 || last < max(rg.FromSeq, info.State.FirstSeq) {
		return last, nil
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
		return 0, fmt.Errorf("verify: ordered consumer on %s: %w", stream, err)
	}
	// One ordered consumer for the whole walk, pulled continuously: a
	// Fetch per batch would replace (delete and create) the consumer each
	// time. The server removes it when idle; verify needs no permission
	// to delete consumers.
	it, err := oc.Messages(jetstream.PullMaxMessages(min(max(size, 1), 1000)))
	if err != nil {
		return 0, fmt.Errorf("verify: ordered consumer on %s: %w", stream, err)
	}
	defer it.Stop()
	size = max(size, 1)
	chunk := make([]Message, 0, min(size, 1<<16))
	read := 0
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		err := fn(chunk)
		chunk = chunk[:0]
		return err
	}
	for {
		// The stream said how many messages it holds, so a pause is a slow
		// server (a busy machine, an ordered consumer recreated after a
		// missed heartbeat), not the end: wait a while before calling the
		// read short.
		nctx, cancel := context.WithTimeout(ctx, readStall)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return 0, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
			return 0, fmt.Errorf("verify: read %s: stopped at %d of %d messages", stream, read, info.State.Msgs)
		case err != nil:
			return 0, fmt.Errorf("verify: read %s: %w", stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return 0, fmt.Errorf("verify: read %s: %w", stream, err)
		}
		h := map[string]string{}
		for k, v := range m.Headers() {
			if len(v) > 0 {
				h[k] = v[0]
			}
		}
		if !rg.ToTime.IsZero() && md.Timestamp.After(rg.ToTime) {
			return last, flush()
		}
		chunk = append(chunk, Message{Seq: md.Sequence.Stream, ID: h[jetstream.MsgIDHeader], Payload: m.Data(), Header: h})
		read++
		if progress != nil && read%1000 == 0 {
			progress(md.Sequence.Stream, last)
		}
		if md.Sequence.Stream >= last {
			if progress != nil {
				progress(last, last)
			}
			return last, flush()
		}
		if len(chunk) >= size {
			if err := flush(); err != nil {
				return 0, err
			}
		}
	}
}
