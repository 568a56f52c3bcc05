package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// ReadDirect reads the scope's dead letters as [Read] does, but with
// direct gets (verify's reader), which need no consumer: it is how a
// reader under the verifier's NATS user, which may not create one, reads
// them (the console). A header's first value only is kept, and
// DeadLetteredAt is not known (zero).
func ReadDirect(ctx context.Context, js jetstream.JetStream, stream, scope string) ([]Letter, error) {
	if _, err := js.Stream(ctx, stream); err != nil {
		return nil, streamMissing(stream, err)
	}
	name := jsinbox.DeadLetterStream(stream)
	msgs, err := verify.ReadStream(ctx, js, name)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("dlq: dead-letter stream %s not found: %w", name, err)
		}
		return nil, fmt.Errorf("dlq: read %s: %w", name, err)
	}
	var out []Letter
	for _, m := range msgs {
		h := make(nats.Header, len(m.Header))
		for k, v := range m.Header {
			h[k] = []string{v}
		}
		if h.Get(jsinbox.HeaderScope) != scope || h.Get(jsinbox.HeaderStream) != stream {
			continue
		}
		orig, _ := strconv.ParseUint(h.Get(jsinbox.HeaderStreamSeq), 10, 64)
		subject, _ := jsinbox.OriginalSubject(&nats.Msg{Subject: m.Subject, Header: h})
		out = append(out, Letter{Seq: m.Seq, ID: h.Get(jsinbox.HeaderMessageID), Status: h.Get(jsinbox.HeaderStatus),
			Reason: h.Get(jsinbox.HeaderReason), Subject: subject, OrigSeq: orig, Deliveries: h.Get(jsinbox.HeaderDelivered),
			Header: h, Payload: m.Payload})
	}
	return out, nil
}
