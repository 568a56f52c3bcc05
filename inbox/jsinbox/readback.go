// Reading back what the stream stored: a duplicate PubAck is checked
// against the stored payload, and an intent another stream took is named.

package jsinbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/jetinbox/jetinbox/inbox"
)

// checkDuplicate settles an intent the stream acknowledged (ack) as a
// duplicate of the message at ack.Sequence: the same payload on the same
// subject is a duplicate (published); another payload or another subject is
// a conflict. The stream's window dedupes by ID alone, but an intent's
// identity is its ID, subject and payload together, as in the inbox and the
// outbox: a reused ID on another subject would be reported published while
// nothing on its subject was stored, and an effect that routes by subject
// would never see it. If the message cannot be read back, the
// intent is published again (same ID) within its retry budget, which gives
// a new PubAck to check.
func (t *tracker) checkDuplicate(ack jetstream.PubAck) {
	seq := ack.Sequence
	stored, err := t.p.storedMsg(seq)
	if err == nil && stored.Header.Get(jetstream.MsgIDHeader) != t.in.ID {
		err = fmt.Errorf("it holds ID %q", stored.Header.Get(jetstream.MsgIDHeader))
	}
	if err != nil {
		t.retry(fmt.Errorf("duplicate PubAck: reading back stream %s sequence %d: %w", t.p.cfg.Stream, seq, err))
		return
	}
	want, as := t.in.Subject, ""
	if f := t.p.cfg.StoredSubject; f != nil {
		want = f(want)
		as = fmt.Sprintf(" (stored as %q)", want)
	}
	if stored.Subject != want {
		t.fail(fmt.Errorf("%w: stream %s holds ID %s at sequence %d on subject %q, this intent's subject is %q%s",
			inbox.ErrConflict, t.p.cfg.Stream, t.in.ID, seq, stored.Subject, t.in.Subject, as))
		return
	}
	if have, want := inbox.Fingerprint(stored.Data), inbox.Fingerprint(t.in.Payload); have != want {
		t.fail(fmt.Errorf("%w: stream %s holds ID %s at sequence %d with payload sha256 %x…, this intent's is %x…",
			inbox.ErrConflict, t.p.cfg.Stream, t.in.ID, seq, have[:8], want[:8]))
		return
	}
	t.p.duplicates.Add(1)
	t.p.published.Add(1)
	t.ack = ack
	t.done()
}

// storedMsg reads the message at seq with the STREAM.MSG.GET API, which the
// stream leader answers: unlike a direct get it never returns a replica's
// stale view, and it works whether or not the stream allows direct gets
// (nats.go's Stream.GetMsg switches to them when it does, which would need
// another permission).
func (p *Publisher) storedMsg(seq uint64) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.AckTimeout)
	defer cancel()
	req, err := json.Marshal(struct {
		Seq uint64 `json:"seq"`
	}{seq})
	if err != nil {
		return nil, fmt.Errorf("msg get request: %w", err)
	}
	resp, err := p.js.Conn().RequestWithContext(ctx, p.msgGet, req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.msgGet, err)
	}
	var r struct {
		Message *struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Header  []byte `json:"hdrs"`
			Data    []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", p.msgGet, err)
	}
	if r.Error != nil {
		return nil, fmt.Errorf("%s: %w", p.msgGet, r.Error)
	}
	if r.Message == nil || r.Message.Seq != seq {
		return nil, fmt.Errorf("%s: no message %d in the reply", p.msgGet, seq)
	}
	m := &jetstream.RawStreamMsg{Subject: r.Message.Subject, Sequence: seq, Data: r.Message.Data}
	if len(r.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, fmt.Errorf("%s: headers: %w", p.msgGet, err)
		}
	}
	return m, nil
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

// errStreamNotMatch is JetStream's error code for a publish whose
// Nats-Expected-Stream is not the stream that captures its subject.
const errStreamNotMatch = 10060

func isStreamNotMatch(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errStreamNotMatch
}

// wrongStream fails an intent the server refused because another stream
// captures its subject. The refusal nats.go hands over does not say which
// stream that is, so it asks the server once more with a probe that no
// stream can store (an expected last message ID nothing has) and names the
// stream from its reply.
func (t *tracker) wrongStream(refusal error) {
	other := "another stream"
	if name := t.p.streamOf(t.in.Subject); name != "" {
		other = fmt.Sprintf("stream %q", name)
	}
	t.fail(fmt.Errorf("%w: subject %q of intent %s is captured by %s, not %q: %w", ErrWrongStream, t.in.Subject, t.in.ID, other, t.p.cfg.Stream, refusal))
}

// streamOf returns the name of the stream that refuses a publish on subject
// for expecting cfg.Stream, or "" if the probe gets no such answer.
func (p *Publisher) streamOf(subject string) string {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.AckTimeout)
	defer cancel()
	probe := &nats.Msg{Subject: subject, Header: nats.Header{
		jetstream.ExpectedStreamHeader:    []string{p.cfg.Stream},
		jetstream.ExpectedLastMsgIDHeader: []string{"jetinbox-probe-" + nuid.Next()},
	}}
	resp, err := p.js.Conn().RequestMsgWithContext(ctx, probe)
	if err != nil {
		return ""
	}
	var ack struct {
		Stream string `json:"stream"`
		Error  *struct {
			ErrCode int `json:"err_code"`
		} `json:"error"`
	}
	if json.Unmarshal(resp.Data, &ack) != nil || ack.Error == nil || ack.Error.ErrCode != errStreamNotMatch {
		return ""
	}
	return ack.Stream
}
