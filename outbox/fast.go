// PublishFast: a round's rows as one JetStream fast batch (nats-server
// 2.14's allow_batched), marked sent only up to the row the server says it
// has stored.
//
// The protocol, as nats-server 2.15 implements it (stream.go,
// processJetStreamFastBatchMsg; jetstream_batching.go): each message is a
// plain publish whose reply subject carries the batch,
// <inbox>.<batch id>.<flow>.<gap mode>.<batch seq>.<op>.$FI, op 0 for the
// first message, 1 for the next ones, 2 for the last (the commit) and 4 for
// a ping. The server stores each message as it comes, with no staging, and
// answers on the reply subject:
//
//   - {"type":"ack","seq":S,"msgs":M} (a flow acknowledgement) every M
//     messages stored, and S=0 right after the first: with gap mode "fail",
//     every message of the batch up to S is stored, or was a duplicate
//     inside the duplicate window, which the stream drops;
//   - {"type":"gap",...} when a message is missing (lost on the way, or
//     captured by another stream), and {"type":"err","seq":S,...} when
//     message S is refused (a header check, its size): with gap mode
//     "fail" the batch then ends at the message before;
//   - a PubAck {"stream":..,"seq":..,"batch":ID,"count":N} once the batch
//     has ended and every message it kept is stored: messages 1..N are
//     stored (or were duplicates), none after N is. A PubAck with an error
//     ends it too (the stream does not allow fast batches, the batch is
//     unknown: the stream restarted, it timed out after 10 s without a
//     message).
//
// A new stream leader resets its open batches to what it has stored and
// sends a flow acknowledgement; the messages the old leader did not store
// then make a gap, and the batch ends there. Flow acknowledgements, gaps
// and errors can be lost: the relay pings when it has heard nothing for a
// while (the server answers with its last flow acknowledgement, or ends
// the batch if the ping shows a gap), and it gives up after the
// publisher's AckTimeout. So the relay counts a row stored only when a flow
// acknowledgement or the PubAck covers it; every row after that goes again
// in the same round as atomic batches, with the same Nats-Msg-Id, each
// settled by its own outcome (see publishAll), and stays pending if that
// does not get through either.

package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/hook"
)

// fastFlow is the largest flow (messages per flow acknowledgement) the
// relay asks for: the server's own ceiling. A round of up to 1,000 rows
// then fits in the two flows the relay lets go unacknowledged, so it never
// waits for the server before its last row.
const fastFlow = 500

// fastOutstanding is how many flows of messages may be unacknowledged
// before the relay waits for the server.
const fastOutstanding = 2

// Fast batch operations (the <op> of the reply subject).
const (
	fastOpStart  = 0
	fastOpAppend = 1
	fastOpCommit = 2
	fastOpPing   = 4
)

// errFastDisabled is the server's answer to a fast batch on a stream
// without allow_batched (JSBatchPublishDisabledErr).
const errFastDisabled = 10205

// fastReply is any answer on a fast batch's reply subjects: a flow
// acknowledgement, a gap, an error, or the batch's PubAck.
type fastReply struct {
	Type   string `json:"type"`
	Seq    uint64 `json:"seq"`
	Msgs   uint16 `json:"msgs"`
	Stream string `json:"stream"`
	Batch  string `json:"batch"`
	Count  uint64 `json:"count"`
	Error  *struct {
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// fastState is what the server has said about one fast batch so far.
type fastState struct {
	stream, id string

	mu sync.Mutex
	// acked: every row up to this batch sequence is stored.
	acked uint64
	// flow: the server's current messages per flow acknowledgement.
	flow uint64
	// heard: the server has answered the first message.
	heard bool
	// ended: the batch is over; count rows are stored, err says why it
	// ended short, disabled that the stream takes no fast batches.
	ended    bool
	count    uint64
	err      error
	disabled bool
	wake     chan struct{}
	// lose, if set, loses an acknowledgement on its way (a harness's
	// hook.LosePubAck).
	lose func() bool
}

func (f *fastState) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// handle takes one answer of the server.
func (f *fastState) handle(m *nats.Msg) {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.signal()
	f.heard = true
	if len(m.Data) == 0 {
		// A status: 503 when nothing captures a message's subject. The
		// stream sees a gap, or, for the first or last message, the
		// batch never starts or ends: the wait's pings and deadline
		// settle it.
		if f.err == nil {
			f.err = fmt.Errorf("fast batch: status %s on %s", m.Header.Get("Status"), m.Subject)
		}
		return
	}
	var r fastReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return // not ours to read; the PubAck or the deadline settles the batch
	}
	if (r.Type == "ack" || r.Type == "" && r.Error == nil) && f.lose != nil && f.lose() {
		return // lost on its way: the pings and the deadline settle the batch
	}
	switch r.Type {
	case "ack":
		f.acked = max(f.acked, r.Seq)
		if r.Msgs > 0 {
			f.flow = uint64(r.Msgs)
		}
		return
	case "gap", "err":
		// The batch ends at the message before; its PubAck says where.
		if f.err == nil {
			f.err = fmt.Errorf("fast batch: %s", m.Data)
		}
		return
	}
	if r.Stream != f.stream || f.ended {
		// Another stream's answer to a row whose subject it captures:
		// ours sees a gap there and ends the batch.
		return
	}
	if r.Error != nil {
		f.ended, f.count = true, f.acked
		f.err = fmt.Errorf("fast batch: %s (%d)", r.Error.Description, r.Error.ErrCode)
		f.disabled = r.Error.ErrCode == errFastDisabled
		return
	}
	if r.Batch != f.id {
		return
	}
	f.ended, f.count = true, max(r.Count, f.acked)
}

// publishFast is PublishFast: the round's rows as one fast batch, and the
// rows it did not get stored again as atomic batches.
func (r *Relay) publishFast(ctx context.Context, pub *jsinbox.Publisher, batch []inbox.Intent) (outcome, error) {
	if r.noFast.Load() {
		return r.publishAll(ctx, pub, batch)
	}
	out := outcome{refused: map[string]string{}, unsent: map[string]bool{}}
	rows := make([]inbox.Intent, 0, len(batch))
	for _, in := range batch {
		if err := in.Validate(); err != nil {
			out.refused[in.ID] = err.Error()
			continue
		}
		rows = append(rows, in)
	}
	if len(rows) == 0 {
		return out, nil
	}
	stored, err := r.fastBatch(ctx, rows)
	if err != nil {
		return outcome{}, err
	}
	if stored == len(rows) {
		r.fastBatches.Add(1)
		return out, nil
	}
	r.fastShort.Add(1)
	// The rest go as atomic batches with the same IDs: the stream drops
	// the copies of rows it stored after all (past the last answer that
	// reached us), and each row gets its own outcome.
	rest := rows[stored:]
	more, err := settleAll(ctx, rest, pub.PublishAll(ctx, rest))
	if err != nil {
		return outcome{}, err
	}
	for id, why := range more.refused {
		out.refused[id] = why
	}
	out.unsent = more.unsent
	out.duplicates = more.duplicates
	return out, nil
}

// fastBatch publishes rows as one fast batch and returns how many of them,
// from the first, the server has said are stored. An error is a crash of
// the harness's hook or ctx ending.
func (r *Relay) fastBatch(ctx context.Context, rows []inbox.Intent) (int, error) {
	nc := r.js.Conn()
	inboxSubj := nc.NewInbox()
	f := &fastState{stream: r.cfg.Stream, wake: make(chan struct{}, 1), flow: fastFlow,
		lose: func() bool { return r.fires(hook.LosePubAck) }}
	f.id = inboxSubj[lastDot(inboxSubj)+1:]
	sub, err := nc.Subscribe(inboxSubj+".>", f.handle)
	if err != nil {
		r.cfg.Logger.Warn("outbox: relay: fast batch: subscribing to its answers failed; publishing atomic batches", "err", err)
		return 0, nil
	}
	defer func() { _ = sub.Unsubscribe() }()
	prefix := inboxSubj + "." + strconv.Itoa(fastFlow) + ".fail."
	reply := func(seq, op int) string {
		return prefix + strconv.Itoa(seq) + "." + strconv.Itoa(op) + ".$FI"
	}
	timeout := r.cfg.Publisher.WithDefaults().AckTimeout
	deadline := time.Now().Add(timeout)
	ping := func(seq int) {
		_ = nc.PublishMsg(&nats.Msg{Subject: rows[0].Subject, Reply: reply(seq, fastOpPing)})
	}
	// wait waits until ok() holds, the batch has ended or the deadline
	// has passed, pinging when the server is quiet for a while; it
	// reports whether the batch can go on.
	wait := func(sent int, ok func() bool) bool {
		var quiet, end *time.Timer // made only when the server is behind
		defer func() {
			if quiet != nil {
				quiet.Stop()
				end.Stop()
			}
		}()
		for {
			f.mu.Lock()
			done, good := f.ended, ok()
			f.mu.Unlock()
			if done || good {
				return !done
			}
			left := time.Until(deadline)
			if left <= 0 {
				return false
			}
			if quiet == nil {
				quiet, end = time.NewTimer(max(timeout/4, 50*time.Millisecond)), time.NewTimer(left)
			}
			select {
			case <-f.wake:
			case <-quiet.C:
				ping(sent)
				quiet.Reset(max(timeout/4, 50*time.Millisecond))
			case <-end.C:
				return false
			case <-ctx.Done():
				return false
			}
		}
	}
	crashAt := (len(rows) + 1) / 2
	sent := 0
	for i, in := range rows {
		seq, op := i+1, fastOpAppend
		switch {
		case seq == len(rows):
			op = fastOpCommit
		case seq == 1:
			op = fastOpStart
		}
		h := nats.Header{jetstream.MsgIDHeader: []string{in.ID}}
		if !r.cfg.Publisher.SkipExpectedStreamHeader {
			h[jetstream.ExpectedStreamHeader] = []string{r.cfg.Stream}
		}
		if err := nc.PublishMsg(&nats.Msg{Subject: in.Subject, Reply: reply(seq, op), Header: h, Data: in.Payload}); err != nil {
			r.cfg.Logger.Debug("outbox: relay: fast batch: publish failed; the rest goes as atomic batches", "seq", seq, "err", err)
			break
		}
		sent = seq
		if seq == crashAt && r.fires(hook.RelayPubAckWait) {
			// The process dies in the middle of its batch: some rows
			// stored, the batch never committed, nothing marked.
			return 0, &hook.Crash{Point: hook.RelayPubAckWait}
		}
		if seq == len(rows) {
			break
		}
		var keepOn bool
		if seq == 1 {
			// The first answer says whether the stream takes fast
			// batches at all, and its flow.
			keepOn = wait(sent, func() bool { return f.heard })
		} else {
			keepOn = wait(sent, func() bool { return uint64(sent) < f.acked+fastOutstanding*f.flow })
		}
		if !keepOn {
			break
		}
	}
	if sent == len(rows) {
		wait(sent, func() bool { return false })
	}
	f.mu.Lock()
	stored, ended, disabled, why := f.count, f.ended, f.disabled, f.err
	if !ended {
		stored = f.acked // what the flow acknowledgements covered
	}
	f.mu.Unlock()
	if ctx.Err() != nil {
		return 0, fmt.Errorf("outbox: relay: waiting for the fast batch's acknowledgements: %w", ctx.Err())
	}
	if disabled && !r.noFast.Swap(true) {
		r.cfg.Logger.Warn("outbox: relay: the stream does not allow fast batches (allow_batched); publishing atomic batches",
			"stream", r.cfg.Stream, "err", why)
	}
	stored = min(stored, uint64(sent))
	if int(stored) < len(rows) {
		if why == nil && !ended {
			why = fmt.Errorf("fast batch: no PubAck within %v", timeout)
		}
		r.cfg.Logger.Debug("outbox: relay: fast batch stored in part; the rest goes as atomic batches",
			"rows", len(rows), "stored", stored, "err", why)
	}
	return int(stored), nil
}

// lastDot is the index of the last '.' in s, -1 if none.
func lastDot(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '.' {
			return i
		}
	}
	return -1
}
