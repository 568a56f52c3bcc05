// Reading a stream: the range to check, and its messages, read with
// batched direct gets.

package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	Seq uint64
	ID  string
	// Subject is part of the intent's identity with ID and payload: a copy
	// of an applied ID on another subject is not settled by its row.
	Subject string
	Payload []byte
	Header  map[string]string
}

// readStall is how long a stream read waits for the next message before it
// reports the read as stopped short.
const readStall = 30 * time.Second

// ReadStream reads every message currently in stream with direct gets
// (the stream must allow them): verify creates no consumer, so its NATS
// user needs no permission that could create, change or delete one, or make
// the server deliver a stream anywhere.
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

// ErrNoDirectGet is returned for a stream that does not allow direct gets,
// which verify reads streams with.
var ErrNoDirectGet = errors.New("verify: the stream does not allow direct gets")

// directBatch is how many messages one direct get request asks for: one
// round trip per this many messages.
const directBatch = 1000

// lagWait is how long a read waits for a replica to catch up: a direct get
// is answered by any replica of the stream, and one that lags the leader
// may not have a message the leader's stream info counted yet.
const lagWait = 2 * time.Second

// walkRange reads a range of stream with direct gets and hands it to fn in
// chunks of up to size messages, in stream order; a chunk is not used after
// fn returns. It returns the last sequence of the range as the stream stood
// when the walk began (ToSeq if earlier): no message after it is read.
func walkRange(ctx context.Context, js jetstream.JetStream, stream string, rg Range, size int, progress func(read, total uint64), fn func([]Message) error) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("verify: stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("verify: stream %s: %w", stream, err)
	}
	if !info.Config.AllowDirect {
		return 0, fmt.Errorf("%w: stream %s: verify reads streams with direct gets and needs no consumer of its own; "+
			"set allow_direct (as deploy/jetstream/*.json do) with a stream update, e.g. nats stream edit %s --allow-direct", ErrNoDirectGet, stream, stream)
	}
	last := info.State.LastSeq
	if rg.ToSeq > 0 && rg.ToSeq < last {
		last = rg.ToSeq
	}
	if info.State.Msgs == 0 || last < max(rg.FromSeq, info.State.FirstSeq) {
		return last, nil
	}
	nc := js.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, fmt.Errorf("verify: read %s: %w", stream, err)
	}
	defer sub.Unsubscribe()
	subject := apiPrefix(js.Options()) + "DIRECT.GET." + stream

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
	// The first request starts at a sequence or a time; each next one
	// after the last message read. A batch skips deleted sequences.
	type request struct {
		Seq       uint64     `json:"seq,omitempty"`
		StartTime *time.Time `json:"start_time,omitempty"`
		Batch     int        `json:"batch"`
	}
	next := request{Seq: max(rg.FromSeq, 1)}
	if rg.FromSeq <= 1 && !rg.FromTime.IsZero() {
		next = request{StartTime: &rg.FromTime}
	}
	var lagSince time.Time
	for {
		next.Batch = int(min(uint64(directBatch), last-max(next.Seq, 1)+1))
		req, err := json.Marshal(next)
		if err != nil {
			return 0, fmt.Errorf("verify: read %s: %w", stream, err)
		}
		if err := nc.PublishRequest(subject, inbox, req); err != nil {
			return 0, fmt.Errorf("verify: read %s: %w", stream, err)
		}
		got := 0
	batch:
		for {
			// The stream said how many messages it holds, so a pause is a
			// slow server (a busy machine), not the end: wait a while
			// before calling the read short.
			nctx, cancel := context.WithTimeout(ctx, readStall)
			m, err := sub.NextMsgWithContext(nctx)
			cancel()
			switch {
			case err != nil && ctx.Err() != nil:
				return 0, ctx.Err()
			case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
				return 0, fmt.Errorf("verify: read %s: stopped at %d of %d messages", stream, read, info.State.Msgs)
			case err != nil:
				return 0, fmt.Errorf("verify: read %s: %w", stream, err)
			}
			if len(m.Data) == 0 && m.Header.Get(statusHeader) != "" {
				switch st := m.Header.Get(statusHeader); st {
				case "204": // end of the batch
					break batch
				case "404": // nothing at or after the sequence asked for
					break batch
				default:
					return 0, fmt.Errorf("verify: read %s: direct get answered %s %s", stream, st, m.Header.Get(descrHeader))
				}
			}
			msg, ts, err := directMsg(m, !rg.ToTime.IsZero())
			if err != nil {
				return 0, fmt.Errorf("verify: read %s: %w", stream, err)
			}
			if !rg.ToTime.IsZero() && ts.After(rg.ToTime) {
				return last, flush()
			}
			if msg.Seq > last {
				// Published after the walk began: not part of it.
				if progress != nil {
					progress(last, last)
				}
				return last, flush()
			}
			got++
			next = request{Seq: msg.Seq + 1}
			chunk = append(chunk, msg)
			read++
			if progress != nil && read%1000 == 0 {
				progress(msg.Seq, last)
			}
			if msg.Seq >= last {
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
		if got > 0 {
			lagSince = time.Time{}
			continue
		}
		// Nothing after the last message read although the stream's last
		// sequence is further on: a replica that has not caught up yet (ask
		// again, another one may answer), or the rest deleted.
		if lagSince.IsZero() {
			lagSince = time.Now()
		} else if time.Since(lagSince) > lagWait {
			if progress != nil {
				progress(last, last)
			}
			return last, flush()
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// The status headers of a direct get's control replies, and the headers it
// adds to each message it returns.
const (
	statusHeader = "Status"
	descrHeader  = "Description"
)

var directHeaders = []string{jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.SubjectHeader, jetstream.TimeStampHeaer, "Nats-Num-Pending", jetstream.LastSequenceHeader}

func isDirectHeader(k string) bool {
	for _, d := range directHeaders {
		if k == d {
			return true
		}
	}
	return false
}

// directMsg is a direct get reply as a Message, without the headers the
// direct get added; its timestamp only if withTime.
func directMsg(m *nats.Msg, withTime bool) (Message, time.Time, error) {
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return Message{}, time.Time{}, fmt.Errorf("direct get reply without a sequence: %v", m.Header)
	}
	var ts time.Time
	if withTime {
		if ts, err = time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer)); err != nil {
			return Message{}, time.Time{}, fmt.Errorf("direct get reply %d: time stamp: %w", seq, err)
		}
	}
	h := make(map[string]string, max(len(m.Header)-len(directHeaders), 1))
	for k, v := range m.Header {
		if len(v) > 0 && !isDirectHeader(k) {
			h[k] = v[0]
		}
	}
	return Message{Seq: seq, ID: h[jetstream.MsgIDHeader], Subject: m.Header.Get(jetstream.SubjectHeader), Payload: m.Data, Header: h}, ts, nil
}

// apiPrefix is the JetStream API prefix js sends its requests with.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}
