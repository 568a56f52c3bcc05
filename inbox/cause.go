// Why a message was not applied, as a value: Outcome.Reason is for people,
// Outcome.Cause for code (metrics, dashboards, alerts).

package inbox

import (
	"errors"
	"fmt"
)

// Cause says what decided an [Outcome] that is not an application: which
// check rejected the message, or why it is to be retried. Match on it
// rather than on [Outcome.Reason], whose text may change.
type Cause uint8

// The causes the processor reports.
const (
	// CauseNone: applied, or a duplicate of an applied message.
	CauseNone Cause = iota

	// CauseInvalidID: the message ID is empty, overlong or not printable
	// ([ErrInvalidID]). Rejected before the claim.
	CauseInvalidID
	// CauseInvalidSubject: the subject cannot be stored as text
	// ([ErrInvalidSubject]). Rejected before the claim.
	CauseInvalidSubject
	// CauseClaimRefused: the database refused the claim with a data error
	// ([ErrClaimRefused]).
	CauseClaimRefused
	// CauseBadInput: the effect refused the message's input for good: a
	// permanent error marked with [BadInput] (it wraps [ErrBadInput]).
	CauseBadInput
	// CausePermanent: the effect failed with any other permanent error
	// ([Permanent], or a data error the database raised for this message
	// alone).
	CausePermanent
	// CausePanic: the effect panicked on this message.
	CausePanic
	// CauseGaveUp: the effect failed with a retryable error on the final
	// delivery ([Message.Final]), so the message is rejected rather than
	// dropped.
	CauseGaveUp
	// CauseConflict: the message ID was claimed before with a different
	// payload.
	CauseConflict
	// CauseRejectedBefore: another copy of an intent whose inbox row
	// already says rejected; the reason is the stored row's.
	CauseRejectedBefore

	// CauseTransient: the effect failed with a retryable error; retry.
	CauseTransient
	// CauseBatchFailed: the batch as a whole could not be committed (the
	// database is unreachable, or the commit outcome is unknown); retry.
	CauseBatchFailed
)

var causeNames = [...]string{"none", "invalid_id", "invalid_subject", "claim_refused", "bad_input", "permanent",
	"panic", "gave_up", "conflict", "rejected_before", "transient", "batch_failed"}

// String returns the cause's name: none, invalid_id, invalid_subject,
// claim_refused, bad_input, permanent, panic, gave_up, conflict,
// rejected_before, transient or batch_failed.
func (c Cause) String() string {
	if int(c) < len(causeNames) {
		return causeNames[c]
	}
	return fmt.Sprintf("Cause(%d)", uint8(c))
}

// ErrBadInput marks an effect error caused by the message's input itself (a
// malformed payload, an unknown account): no retry can fix it. An error
// wrapping it is permanent ([IsPermanent]) and rejects the message with
// [CauseBadInput]. Wrap an error with [BadInput] to keep its text.
var ErrBadInput = errors.New("inbox: bad input")

// BadInput marks err as the input's fault: permanent, with [CauseBadInput].
// Its text stays err's, and errors.Is finds both err's chain and
// [ErrBadInput]. BadInput(nil) is nil.
func BadInput(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: badInputError{err}}
}

// badInputError is err, also matching ErrBadInput.
type badInputError struct{ err error }

func (e badInputError) Error() string   { return e.err.Error() }
func (e badInputError) Unwrap() []error { return []error{e.err, ErrBadInput} }

// errEffectPanicked wraps the error a panic of the effect becomes.
var errEffectPanicked = errors.New("inbox: effect panicked")

// rejectCause says which of the effect-decided rejection causes a permanent
// error is.
func rejectCause(err error) Cause {
	switch {
	case errors.Is(err, errEffectPanicked):
		return CausePanic
	case errors.Is(err, ErrBadInput):
		return CauseBadInput
	case errors.Is(err, ErrClaimRefused):
		return CauseClaimRefused
	case errors.Is(err, ErrInvalidSubject):
		return CauseInvalidSubject
	case errors.Is(err, ErrInvalidID):
		return CauseInvalidID
	}
	return CausePermanent
}
