package inbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrConflict reports an intent whose ID was used before with another
// subject or payload: the "same key, different body" case of idempotency
// keys, never a success. A second attempt of the same work must emit the
// same intent, so it is a bug in how IDs are derived (or a reused ID).
// Where it comes from:
//
//   - jsinbox's Publisher, when the stream already holds the ID inside its
//     duplicate window with another payload or subject: JetStream
//     deduplicates by ID alone and dropped the intent; the publisher finds
//     it by reading back, on a duplicate PubAck only, the message the
//     PubAck names, and comparing fingerprints ([Fingerprint]).
//   - an outbox store's Add, for an ID the outbox already holds with
//     another subject or payload.
//
// The consumer's inbox reports the same case as [StatusConflict].
var ErrConflict = errors.New("inbox: intent ID reused with a different subject or payload")

// Intent is one message to publish under a stable ID: what a publisher
// sends, what an outbox stores until its transaction commits, and what a
// relay publishes from the outbox. The consumer's inbox makes the ID's
// effect happen once.
type Intent struct {
	// ID is the intent's stable identity, sent as Nats-Msg-Id: the same on
	// every retry of the work that emits it. Required; see [ValidateID].
	ID string
	// Subject is the NATS subject to publish to: no wildcards, no empty
	// tokens, no spaces or control characters, at most [MaxSubjectLen]
	// bytes. Required.
	Subject string
	// Payload is the message body; every retry of one ID must send the
	// same bytes (see [Fingerprint]).
	Payload []byte
	// Parent is the ID of the message whose effect emitted this one, if
	// any: an outbox stores it for checks and operators. Never sent.
	Parent string
}

// ErrBadIntent is wrapped by every refusal of an [Intent] that can never
// be published: [Intent.Validate] says why. The publisher, the outbox and
// the relay refuse the same intents with it.
var ErrBadIntent = errors.New("inbox: bad intent")

// Validate reports, wrapping [ErrBadIntent], why in can never be published
// and applied: an invalid ID or parent ID, or a subject that is no NATS
// subject to publish to or that every inbox would reject. Every component
// that takes an intent calls it before anything is sent or written.
func (in *Intent) Validate() error {
	if err := ValidateID(in.ID); err != nil {
		return fmt.Errorf("%w: %w", ErrBadIntent, err)
	}
	if err := validatePublishSubject(in.Subject); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadIntent, in.ID, err)
	}
	if in.Parent != "" {
		if err := ValidateID(in.Parent); err != nil {
			return fmt.Errorf("%w: %s: parent: %w", ErrBadIntent, in.ID, err)
		}
	}
	return nil
}

// validatePublishSubject checks s is a subject to publish to that an inbox
// can store: the inbox's limits (length, UTF-8, no NUL) and NATS's (no
// wildcard, no empty token, no whitespace or control character).
func validatePublishSubject(s string) error {
	switch {
	case s == "":
		return errors.New("empty subject")
	case len(s) > MaxSubjectLen:
		// Every inbox would reject it: say so now, not in a dead letter.
		return fmt.Errorf("subject of %d bytes, more than %d", len(s), MaxSubjectLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("subject %q is not valid UTF-8", truncateSubject(s))
	case strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, ".."):
		return fmt.Errorf("subject %q has an empty token", s)
	}
	for _, r := range s {
		switch {
		case r == '*' || r == '>':
			return fmt.Errorf("subject %q has a wildcard: not a subject to publish to", s)
		case unicode.IsSpace(r) || unicode.IsControl(r):
			return fmt.Errorf("subject %q has a space or control character", s)
		}
	}
	return nil
}
