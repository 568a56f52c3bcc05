package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jetinbox/jetinbox/inbox"
)

// Sentinel errors. Match them with [errors.Is].
var (
	// ErrNotMigrated is returned by a store's CheckSchema when the outbox
	// table is missing or older than the store's package.
	ErrNotMigrated = errors.New("outbox: schema not migrated (run `jetinbox migrate` or apply the store's MigrationSQL)")
)

// Component is the name the outbox's migrations are recorded under in
// jetinbox_migrations, by every store.
const Component = "outbox"

// maxKindLen bounds the kind of a follow-up, so that a derived ID stays
// well inside [inbox.MaxIDLen].
const maxKindLen = 64

// FollowUpID returns the ID of the follow-up of kind emitted by the message
// parent: the same for the same inputs on every redelivery and replay, so a
// second attempt can emit neither a second message nor a different one. It
// is kind + ":" + parent, or, when that would be longer than
// [inbox.MaxIDLen], kind + ":h" + the hex SHA-256 of parent.
//
// parent must be a valid message ID (see [inbox.ValidateID]); kind names the
// follow-up ("notify", "ship"): 1 to 64 bytes of letters, digits, '-', '_'
// and '.'. A message with several follow-ups uses a kind for each. Two
// effects (scopes) that emit the same kind for the same parent would emit
// the same ID: put the scope in the kind then.
func FollowUpID(parent, kind string) (string, error) {
	if err := inbox.ValidateID(parent); err != nil {
		return "", fmt.Errorf("%w: parent: %w", inbox.ErrBadIntent, err)
	}
	if err := validateKind(kind); err != nil {
		return "", err
	}
	if id := kind + ":" + parent; len(id) <= inbox.MaxIDLen {
		return id, nil
	}
	sum := sha256.Sum256([]byte(parent))
	return kind + ":h" + hex.EncodeToString(sum[:]), nil
}

func validateKind(kind string) error {
	if kind == "" || len(kind) > maxKindLen {
		return fmt.Errorf("%w: follow-up kind %q: want 1 to %d bytes", inbox.ErrBadIntent, kind, maxKindLen)
	}
	for i := 0; i < len(kind); i++ {
		c := kind[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%w: follow-up kind %q: only letters, digits, '-', '_' and '.'", inbox.ErrBadIntent, kind)
		}
	}
	return nil
}
