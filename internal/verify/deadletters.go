// Dead letters: which stream messages the dead-letter stream settles.

package verify

import (
	"context"
	"errors"
	"fmt"
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
	ctx           context.Context
	js            jetstream.JetStream
	stream, scope string
	rg            Range
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
	// expired: the sequences with an expired record counted, and the
	// deliveries the record names.
	expired map[uint64]string
}

func newDeadLetters(ctx context.Context, js jetstream.JetStream, stream, scope string, rg Range) *deadLetters {
	return &deadLetters{ctx: ctx, js: js, stream: stream, scope: scope, rg: rg, pending: map[uint64][]deadEntry{},
		ok: map[deadKey]bool{}, unchecked: map[deadKey]bool{}, looked: map[deadKey]bool{}, expired: map[uint64]string{}}
}

// foreign says why m, a message of the dead-letter stream, is not a record
// a consumer of this stream wrote ("" if it is one). A consumer publishes
// its dead letters and expired records pinned to the dead-letter stream
// (Nats-Expected-Stream, which the stream keeps), with an ID made of
// scope, stream and sequence, and its headers; nothing else settles an
// intent. NATS does not check reply subjects against permissions, so a
// key that may only make requests can have the server store its answer
// here: a JetStream API response (no headers), or a direct get or a
// consumer's delivery of an intent whose headers the producer chose. No
// intent can carry this Nats-Expected-Stream (the intents stream refuses
// it), and a direct get's answer carries the Nats-Stream and
// Nats-Sequence of the message it copies.
func (d *deadLetters) foreign(m Message) string {
	h := m.Header
	stream, scope, status := h[jsinbox.HeaderStream], h[jsinbox.HeaderScope], h[jsinbox.HeaderStatus]
	seq, err := strconv.ParseUint(h[jsinbox.HeaderStreamSeq], 10, 64)
	_, hasID := h[jsinbox.HeaderMessageID]
	_, copied := h[jetstream.StreamHeader]
	_, copiedSeq := h[jetstream.SequenceHeader]
	switch {
	case stream != d.stream:
		return fmt.Sprintf("names stream %q, not %s", stream, d.stream)
	case scope == "" || status == "" || err != nil || seq == 0:
		return "lacks the consumer's scope, status or stream sequence headers"
	case status != jsinbox.DeadLetterExpired && !hasID:
		return "names no message ID"
	case h[jetstream.ExpectedStreamHeader] != jsinbox.DeadLetterStream(d.stream):
		return "was not published pinned to the dead-letter stream, as a consumer publishes"
	case copied || copiedSeq:
		return "is a copy of a stored message (a direct get's answer)"
	case m.ID != scope+":"+d.stream+":"+strconv.FormatUint(seq, 10):
		return fmt.Sprintf("has message ID %q, not the consumer's for its scope, stream and sequence", m.ID)
	}
	return ""
}

// add files one record of the dead-letter stream. A foreign one (see
// foreign) is counted as such and settles nothing; one of another scope
// is another consumer's; an expired record is counted at once; a dead
// letter is counted in r when the chunk with its sequence is walked
// (visit).
func (d *deadLetters) add(r *Report, m Message) {
	if why := d.foreign(m); why != "" {
		r.DeadForeign++
		r.example("foreign: message %d of %s %s: it settles nothing", m.Seq, jsinbox.DeadLetterStream(d.stream), why)
		return
	}
	if m.Header[jsinbox.HeaderScope] != d.scope {
		return
	}
	seq, _ := strconv.ParseUint(m.Header[jsinbox.HeaderStreamSeq], 10, 64)
	if m.Header[jsinbox.HeaderStatus] == jsinbox.DeadLetterExpired {
		d.addExpired(r, m, seq)
		return
	}
	d.pending[seq] = append(d.pending[seq], deadEntry{m.Seq, m.Header[jsinbox.HeaderMessageID], m.Header[jsinbox.HeaderStatus]})
}

// addExpired counts an expired record: the message at seq was given up on
// and aged out before a consumer could rescue it, so whether it was ever
// applied is unknown. A range by sequence counts only the records of its
// sequences. A record for a message the stream still holds is false, and
// foreign.
func (d *deadLetters) addExpired(r *Report, m Message, seq uint64) {
	if _, seen := d.expired[seq]; seen || seq < d.rg.FromSeq || (d.rg.ToSeq > 0 && seq > d.rg.ToSeq) {
		return
	}
	s, err := d.js.Stream(d.ctx, d.stream)
	if err == nil {
		_, err = s.GetMsg(d.ctx, seq)
	}
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		r.DeadForeign++
		r.example("foreign: message %d of %s says stream seq %d expired, but the stream holds it (or could not say: %v)", m.Seq, jsinbox.DeadLetterStream(d.stream), seq, err)
		return
	}
	d.expired[seq] = m.Header[jsinbox.HeaderDelivered]
	r.ExpiredBeforeRescue++
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
