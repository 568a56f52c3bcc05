package inbox

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxIDLen is the longest message ID or scope accepted, in bytes.
const MaxIDLen = 200

// MaxSubjectLen is the longest subject a message may have, in bytes. A
// message's subject is echoed where its producer does not control the
// limits: in the inbox row, in the dead letter's subject and headers, in
// log lines. A longer one is rejected at the claim (dead-lettered with a
// reason), never carried further.
const MaxSubjectLen = 256

// Sentinel errors. Match them with [errors.Is].
var (
	// ErrOutcomeUnknown wraps a COMMIT that failed in a way that leaves its
	// outcome unknown (the connection broke while committing). The messages
	// of such a batch must not be acked: a redelivery settles it either way.
	ErrOutcomeUnknown = errors.New("inbox: commit outcome unknown")
	// ErrInvalidID is returned for an empty, overlong or non-printable
	// message ID or scope.
	ErrInvalidID = errors.New("inbox: invalid message ID")
	// ErrInvalidSubject rejects a message whose subject cannot be stored
	// as text (invalid UTF-8 or a NUL byte) or is longer than
	// [MaxSubjectLen].
	ErrInvalidSubject = errors.New("inbox: invalid subject")
	// ErrClaimRefused rejects a message whose claim the database refused
	// with a data error (a constraint, an encoding) that the checks before
	// the claim did not catch; its neighbours are claimed without it.
	ErrClaimRefused = errors.New("inbox: the database refused the claim")
	// ErrUnsafeHorizon is returned by a store's Prune for a retention horizon shorter
	// than the horizon over which messages can come back.
	ErrUnsafeHorizon = errors.New("inbox: retention horizon shorter than the redelivery/replay horizon")
	// ErrCommitNotReplicated wraps a COMMIT that PostgreSQL answered with
	// success and the warning that its wait for the synchronous standby
	// was cancelled: committed on the primary only, so a standby promoted
	// now may lack it. Whatever rests on it (an ack, a sent mark, an HTTP
	// answer) must wait; its outcome is unknown.
	ErrCommitNotReplicated = errors.New("commit not confirmed by the synchronous standby (its wait was cancelled; committed locally only)")
	// ErrCommitsUnwatched says a PostgreSQL pool's connections do not
	// report the warning of a cancelled wait for the synchronous standby:
	// the pool was made without pginbox.WatchCommits (pginbox.NewPool), or
	// an OnNotice handler set after it dropped the watch.
	ErrCommitsUnwatched = errors.New("the database's connections do not report warnings of commits the synchronous standby never confirmed; " +
		"make its pool with pginbox.NewPool, or call pginbox.WatchCommits on its configuration, and keep that OnNotice handler when setting one of your own (call the previous one)")
)

// Message is one delivery of an intent, as the transport received it.
type Message struct {
	// ID is the intent's stable identity (the Nats-Msg-Id header). Required.
	ID string
	// Payload is the intent's body; its fingerprint detects an ID reused
	// with a different payload.
	Payload []byte
	// Subject and StreamSeq locate the message in its stream; stored with
	// the inbox row for operators. Optional.
	Subject   string
	StreamSeq uint64
	// Deliveries is how many times the transport has delivered this
	// message, 1 on the first delivery. Optional.
	Deliveries uint64
	// Final marks the last delivery the transport will make (MaxDeliver
	// reached). A retryable failure of a final delivery is recorded as a
	// rejection instead, so that no intent is dropped silently.
	Final bool
	// Published is when the stream stored the message, for latency
	// figures. Optional.
	Published time.Time
}

// Fingerprint returns the SHA-256 of the payload. Publishers must send the
// same bytes for every retry of one intent.
func Fingerprint(payload []byte) [32]byte { return sha256.Sum256(payload) }

// ValidateID reports whether id is usable as a message ID or a scope:
// 1 to [MaxIDLen] bytes of valid UTF-8 with no control or space characters.
func ValidateID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidID)
	case len(id) > MaxIDLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidID, len(id), MaxIDLen)
	}
	for i := 0; i < len(id); {
		c := id[i]
		if c < utf8.RuneSelf {
			if c <= ' ' || c == 0x7f {
				return fmt.Errorf("%w: control or space character at byte %d", ErrInvalidID, i)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(id[i:])
		if r == utf8.RuneError && size == 1 {
			return fmt.Errorf("%w: invalid UTF-8 at byte %d", ErrInvalidID, i)
		}
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return fmt.Errorf("%w: control or space character at byte %d", ErrInvalidID, i)
		}
		i += size
	}
	return nil
}

// validateMessage checks what goes into a claim before the claim
// statement, which would otherwise fail for the whole batch.
func validateMessage(m *Message) error {
	if err := ValidateID(m.ID); err != nil {
		return err
	}
	if len(m.Subject) > MaxSubjectLen {
		return fmt.Errorf("%w: %d bytes, more than %d (%q…)", ErrInvalidSubject, len(m.Subject), MaxSubjectLen, truncateSubject(m.Subject))
	}
	if !utf8.ValidString(m.Subject) {
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidSubject)
	}
	if strings.IndexByte(m.Subject, 0) >= 0 {
		return fmt.Errorf("%w: NUL byte", ErrInvalidSubject)
	}
	return nil
}

// truncateSubject cuts s to at most 64 bytes, on a rune boundary, for
// reasons and log lines.
func truncateSubject(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// Status is what happened to one message of a batch, and so what the
// transport does with it.
type Status uint8

// The statuses a batch reports.
const (
	// StatusRetry: nothing was committed for this message. Do not ack;
	// redeliver later (NakWithDelay with a jittered delay).
	StatusRetry Status = iota
	// StatusApplied: the inbox row and the effect committed now. Ack.
	StatusApplied
	// StatusDuplicate: the inbox already held this (scope, ID) with the same
	// fingerprint and an applied effect. Nothing was done. Ack.
	StatusDuplicate
	// StatusRejected: the message can never be applied (bad input, a
	// permanent effect error, a panic, or retries exhausted on the final
	// delivery). The inbox row records status rejected and the reason.
	// Dead-letter it, then terminate it.
	StatusRejected
	// StatusConflict: the inbox already held this ID with a different
	// fingerprint. Not applied; recorded in inbox_conflicts. Dead-letter it,
	// then terminate it.
	StatusConflict
)

var statusNames = [...]string{"retry", "applied", "duplicate", "rejected", "conflict"}

// String returns the status's name: retry, applied, duplicate, rejected or
// conflict.
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Outcome is the result for one message of a batch.
type Outcome struct {
	Status Status
	// Cause says what decided a rejection, a conflict or a retry;
	// CauseNone for an applied message or a duplicate. Code matches on
	// it, never on Reason.
	Cause Cause
	// Reason explains a rejection, a conflict or a retry, for people and
	// for the dead-letter message.
	Reason string
	// AlreadyInInbox is true when the inbox already held the message's row
	// (a duplicate, or a message rejected before), so this delivery changed
	// nothing. It says nothing of JetStream's redelivery: that is
	// Message.Deliveries > 1.
	AlreadyInInbox bool
	// Err is the underlying error of a retry or rejection, if any.
	Err error
	// NotMessageFault marks a retry that no fault of the message caused:
	// the database or the deployment could not take the batch (it is
	// unreachable, read-only, lacks the schema or a grant, sits behind a
	// pooler that refuses the transaction, or the commit's outcome is
	// unknown), or the message is not this consumer's to apply now (its
	// partition moved to another shard). A transport never gives up on
	// such a message on its last delivery: it leaves it unsettled, the
	// server gives up on it and says so in an advisory, and the rescue
	// applies it once the cause is gone. Only the message's own faults (a
	// data error, a [Permanent] or [BadInput] effect error, a retryable
	// effect error on the last delivery) reject it.
	NotMessageFault bool
	// FirstSeq, for an outcome decided by another message (a row already
	// in the inbox, or a copy earlier in the batch), is the stream
	// sequence of that message, when known; 0 otherwise. A rejected
	// intent whose FirstSeq names another message is dead-lettered as
	// that message: a transport terminates this copy without a second
	// dead letter.
	FirstSeq uint64
}

// Ackable reports whether the transport may ack the message: its inbox row
// is committed and its effect applied, now or before.
func (o Outcome) Ackable() bool { return o.Status == StatusApplied || o.Status == StatusDuplicate }

// PermanentError marks an effect error that no retry can fix: bad input,
// a business rule, a missing account. Create one with [Permanent], or with
// [BadInput] when the input is at fault.
type PermanentError struct{ Err error }

// Error returns the wrapped error's message.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent: the message is rejected instead of
// retried. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err is, or wraps, a [PermanentError] or
// [ErrBadInput].
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p) || errors.Is(err, ErrBadInput)
}
