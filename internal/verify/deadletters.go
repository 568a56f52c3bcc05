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

// deadEntry is one dead letter not yet matched against the stream.
type deadEntry struct {
	dseq       uint64 // its own sequence in the dead-letter stream
	id, status string
}

// deadLetters holds the dead letters of one stream and scope, keyed by the
// stream sequence and message ID their headers name. Its size follows the
// dead-letter stream's, not the intents stream's: the range is walked in
// chunks and each chunk settles the dead letters of its sequences.
type deadLetters struct {
	ctx    context.Context
	js     jetstream.JetStream
	stream string
	// pending: dead letters for sequences not walked yet, in the order the
	// dead-letter stream holds them.
	pending map[uint64][]deadEntry
	// ok: dead letters whose ID is that of the stream message at their
	// sequence. unchecked: dead letters for sequences not read (outside
	// the range, or no message there), checked against the stream when
	// first asked about.
	ok, unchecked map[deadKey]bool
	// looked: answers for pending dead letters asked about before their
	// chunk was walked.
	looked map[deadKey]bool
}

func newDeadLetters(ctx context.Context, js jetstream.JetStream, stream string) *deadLetters {
	return &deadLetters{ctx: ctx, js: js, stream: stream, pending: map[uint64][]deadEntry{},
		ok: map[deadKey]bool{}, unchecked: map[deadKey]bool{}, looked: map[deadKey]bool{}}
}

// add files one dead letter of the stream and scope; it is counted in r
// when the chunk with its sequence is walked (visit).
func (d *deadLetters) add(r *Report, m Message) {
	seq, err := strconv.ParseUint(m.Header[jsinbox.HeaderStreamSeq], 10, 64)
	id, hasID := m.Header[jsinbox.HeaderMessageID]
	if err != nil || !hasID {
		r.DeadMismatched++
		r.example("dead letter %d of %s names no stream sequence or message ID: it settles nothing", m.Seq, d.stream)
		return
	}
	d.pending[seq] = append(d.pending[seq], deadEntry{m.Seq, id, m.Header[jsinbox.HeaderStatus]})
}

// visit settles the dead letters of a chunk's sequences, counting in r
// those that stand for a message of the chunk. Dead letters for sequences
// up to the chunk's last that no message of the chunk has are unchecked.
func (d *deadLetters) visit(r *Report, chunk []Message) {
	if len(d.pending) == 0 || len(chunk) == 0 {
		return
	}
	for _, m := range chunk {
		es, ok := d.pending[m.Seq]
		if !ok {
			continue
		}
		delete(d.pending, m.Seq)
		for _, e := range es {
			k := deadKey{m.Seq, e.id}
			switch {
			case d.ok[k]:
				// the same message dead-lettered again
			case e.id != m.ID:
				r.DeadMismatched++
				r.example("dead letter %d names stream seq %d with id %q, but that message's id is %q: it settles nothing", e.dseq, m.Seq, e.id, m.ID)
			default:
				d.ok[k] = true
				r.DeadLettered++
				r.DeadByStatus[e.status]++
			}
		}
	}
	last := chunk[len(chunk)-1].Seq
	for seq, es := range d.pending {
		if seq <= last {
			d.unread(seq, es)
		}
	}
}

// done marks every dead letter not settled by a chunk as unchecked.
func (d *deadLetters) done() {
	for seq, es := range d.pending {
		d.unread(seq, es)
	}
}

func (d *deadLetters) unread(seq uint64, es []deadEntry) {
	delete(d.pending, seq)
	for _, e := range es {
		d.unchecked[deadKey{seq, e.id}] = true
	}
}

// at reports whether the stream message at seq with this ID was
// dead-lettered. A dead letter for a sequence that was not read, or not
// yet, is checked against the stream message now; one whose message is
// gone from the stream (aged out) is taken on its headers.
func (d *deadLetters) at(seq uint64, id string) bool {
	k := deadKey{seq, id}
	if d.ok[k] {
		return true
	}
	if es, ok := d.pending[seq]; ok {
		for _, e := range es {
			if e.id == id {
				if v, asked := d.looked[k]; asked {
					return v
				}
				d.looked[k] = d.check(seq, id)
				return d.looked[k]
			}
		}
		return false
	}
	if !d.unchecked[k] {
		return false
	}
	delete(d.unchecked, k)
	if d.check(seq, id) {
		d.ok[k] = true
	}
	return d.ok[k]
}

// check reports whether the stream message at seq has this ID, or is gone.
func (d *deadLetters) check(seq uint64, id string) bool {
	s, err := d.js.Stream(d.ctx, d.stream)
	if err != nil {
		return false
	}
	raw, err := s.GetMsg(d.ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true
	case err == nil && raw.Header.Get(jetstream.MsgIDHeader) == id:
		return true
	}
	return false
}
