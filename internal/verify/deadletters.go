// Dead letters: which stream messages the dead-letter stream settles.

package verify

import (
	"context"
	"errors"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// deadKey is what a dead letter must match: the stream sequence and the
// message ID of the stream message it stands for.
type deadKey struct {
	seq uint64
	id  string
}

// deadLetters holds the dead letters of one stream and scope, keyed by the
// stream sequence and message ID their headers name.
type deadLetters struct {
	ctx    context.Context
	js     jetstream.JetStream
	stream string
	// idAt maps the sequences read from the stream to their message IDs.
	idAt map[uint64]string
	// ok: dead letters whose ID is that of the stream message at their
	// sequence. unchecked: dead letters for sequences not read (outside
	// the range), checked against the stream when first asked about.
	ok, unchecked map[deadKey]bool
}

func newDeadLetters(ctx context.Context, js jetstream.JetStream, stream string, msgs []Message) *deadLetters {
	d := &deadLetters{ctx: ctx, js: js, stream: stream, idAt: make(map[uint64]string, len(msgs)),
		ok: map[deadKey]bool{}, unchecked: map[deadKey]bool{}}
	for _, m := range msgs {
		d.idAt[m.Seq] = m.ID
	}
	return d
}

// add files one dead letter of the stream and scope, counting it in r if it
// stands for a stream message that was read.
func (d *deadLetters) add(r *Report, m Message) {
	seq, err := strconv.ParseUint(m.Header[jsinbox.HeaderStreamSeq], 10, 64)
	id, hasID := m.Header[jsinbox.HeaderMessageID]
	if err != nil || !hasID {
		r.DeadMismatched++
		r.example("dead letter %d of %s names no stream sequence or message ID: it settles nothing", m.Seq, d.stream)
		return
	}
	k := deadKey{seq, id}
	if d.ok[k] || d.unchecked[k] {
		return // the same message dead-lettered again
	}
	sid, read := d.idAt[seq]
	switch {
	case !read:
		d.unchecked[k] = true
	case sid != id:
		r.DeadMismatched++
		r.example("dead letter %d names stream seq %d with id %q, but that message's id is %q: it settles nothing", m.Seq, seq, id, sid)
	default:
		d.ok[k] = true
		r.DeadLettered++
		r.DeadByStatus[m.Header[jsinbox.HeaderStatus]]++
	}
}

// at reports whether the stream message at seq with this ID was
// dead-lettered. A dead letter for a sequence that was not read is checked
// against the stream message now; one whose message is gone from the stream
// (aged out) is taken on its headers.
func (d *deadLetters) at(seq uint64, id string) bool {
	k := deadKey{seq, id}
	if d.ok[k] {
		return true
	}
	if !d.unchecked[k] {
		return false
	}
	delete(d.unchecked, k)
	s, err := d.js.Stream(d.ctx, d.stream)
	if err != nil {
		return false
	}
	raw, err := s.GetMsg(d.ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		d.ok[k] = true
	case err == nil && raw.Header.Get(jetstream.MsgIDHeader) == id:
		d.ok[k] = true
	}
	return d.ok[k]
}
