package delivery

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
)

// Component is the name the delivery migrations are recorded under in
// jetinbox_migrations, by every store.
const Component = "delivery"

// Sentinel errors. Match them with [errors.Is].
var (
	// ErrNotMigrated is returned by a store's CheckSchema when the
	// deliveries table is missing or older than the store's package.
	ErrNotMigrated = errors.New("delivery: schema not migrated (run `jetinbox migrate` or apply the store's MigrationSQL)")
	// ErrLeaseLost is returned by a store's Record when the row is no
	// longer leased by the caller: its lease ran out and another
	// dispatcher took it, or it was recorded already.
	ErrLeaseLost = errors.New("delivery: lease lost")
	// ErrBadIntent wraps every refusal of an [Intent].
	ErrBadIntent = errors.New("delivery: bad intent")
	// ErrConfig wraps every refusal of an endpoint or route configuration.
	ErrConfig = errors.New("delivery: bad configuration")
)

// Intent is one call decided by an effect: its payload is POSTed to the
// endpoint named Endpoint (configured for the dispatcher, never taken from
// a message), once per (Scope, MessageID, Endpoint). A store's Add writes
// it in the effect's own transaction.
type Intent struct {
	// Scope is the inbox scope of the effect that decided the call.
	Scope string
	// MessageID is the ID of the message the effect applied.
	MessageID string
	// Endpoint names a configured endpoint (see [Endpoint.Name]).
	Endpoint string
	// Payload is the request body, sent as it is.
	Payload []byte
}

// MaxPayload is the largest payload an [Intent] may carry.
const MaxPayload = 1 << 20

// Validate reports, wrapping [ErrBadIntent], what is wrong with in.
func (in Intent) Validate() error {
	if err := inbox.ValidateID(in.Scope); err != nil {
		return fmt.Errorf("%w: scope: %w", ErrBadIntent, err)
	}
	if err := inbox.ValidateID(in.MessageID); err != nil {
		return fmt.Errorf("%w: message ID: %w", ErrBadIntent, err)
	}
	if err := ValidateName(in.Endpoint); err != nil {
		return fmt.Errorf("%w: %w", ErrBadIntent, err)
	}
	if len(in.Payload) > MaxPayload {
		return fmt.Errorf("%w: payload of %d bytes, more than %d", ErrBadIntent, len(in.Payload), MaxPayload)
	}
	return nil
}

// Key returns the idempotency key of the call: the same for the same
// (scope, message ID, endpoint) on every attempt, in every dispatcher and
// after every redrive. It is "dlv_" and 32 lower-case hex digits (the
// first 16 bytes of a SHA-256 of the three parts, each prefixed with its
// length), [KeyLen] bytes: inside every provider's limit we know of
// (Worldline 40, Adyen 64, Stripe 255).
func Key(scope, messageID, endpoint string) string {
	h := sha256.New()
	var n [4]byte
	for _, p := range []string{scope, messageID, endpoint} {
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return KeyPrefix + hex.EncodeToString(sum[:16])
}

// KeyPrefix starts every key; KeyLen is every key's length; KeyChars are
// the characters a key is made of.
const (
	KeyPrefix = "dlv_"
	KeyLen    = len(KeyPrefix) + 32
	KeyChars  = "dlv_0123456789abcdef"
)

// Delivery is a leased row: what a dispatcher sends.
type Delivery struct {
	ID        int64
	Scope     string
	MessageID string
	Endpoint  string
	Key       string
	Payload   []byte
	// Attempts counts the sends started, this one included (a lease
	// counts one: a dispatcher that dies after sending still counted it).
	Attempts int
	// FirstAttempt is when the row was first leased for sending: the key
	// retention runs from there.
	FirstAttempt time.Time
	// Created is when the effect's transaction wrote the row.
	Created time.Time
}

// State is where a row stands.
type State string

// The states.
const (
	StatePending   State = "pending"   // waiting to be sent, or to be sent again
	StateDelivered State = "delivered" // the receiver answered 2xx
	StateDead      State = "dead"      // dead-lettered: refused for good, or the outcome is unknown past the key retention
)

// Result is the outcome of one attempt as the store records it.
type Result struct {
	// State is StateDelivered, StateDead, or StatePending to send again
	// after RetryIn.
	State State
	// RetryIn is how long to wait before the next attempt (StatePending).
	RetryIn time.Duration
	// Status is the HTTP status, 0 when no answer came.
	Status int
	// Body is the first bytes of the answer's body (bounded).
	Body []byte
	// Reason says why the attempt was not delivered ("" when it was).
	Reason string
}

// Store is what a [Dispatcher] needs from the database. Package
// pgdelivery and sqlitedelivery implement it.
type Store interface {
	// Lease takes up to n pending rows of endpoint that are due (their
	// retry time has come and nobody holds a live lease on them), leases
	// them to owner for d, counts the attempt and sets the first
	// attempt's time if unset.
	Lease(ctx context.Context, owner, endpoint string, n int, d time.Duration) ([]Delivery, error)
	// Record stores r for the row id if owner still holds its lease, and
	// releases the lease; otherwise it returns [ErrLeaseLost].
	Record(ctx context.Context, owner string, id int64, r Result) error
}

// Row is a row as an operator sees it (jetinbox dlq -deliveries).
type Row struct {
	Delivery
	State      State
	LastStatus int
	LastBody   []byte
	Reason     string
	LastAt     time.Time
}
