package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Header is the request header the key travels in.
const Header = "Idempotency-Key"

// ReplayedHeader is set to "true" on an answer replayed from the store.
const ReplayedHeader = "Idempotent-Replayed"

// MaxKeyLen is the longest key accepted, in bytes (Stripe's limit).
const MaxKeyLen = 255

// ErrBadKey is wrapped by every refusal of an Idempotency-Key header.
var ErrBadKey = errors.New("idempotency: bad Idempotency-Key")

// ParseKey returns the key of an Idempotency-Key header value: the draft's
// sf-string ("…", with \" and \\ escapes) or a bare value. Either way the
// key is 1 to [MaxKeyLen] bytes of ASCII letters, digits and -_.:~+/=
// (UUIDs, ULIDs, base64 and hex all fit). Anything else wraps [ErrBadKey].
func ParseKey(v string) (string, error) {
	if len(v) > MaxKeyLen+2+MaxKeyLen { // escapes at most double the inner length
		return "", fmt.Errorf("%w: %d bytes, more than %d", ErrBadKey, len(v), MaxKeyLen)
	}
	v = strings.TrimSpace(v)
	key := v
	if strings.HasPrefix(v, `"`) {
		if len(v) < 2 || !strings.HasSuffix(v, `"`) {
			return "", fmt.Errorf("%w: unterminated quoted string", ErrBadKey)
		}
		var b strings.Builder
		inner := v[1 : len(v)-1]
		for i := 0; i < len(inner); i++ {
			c := inner[i]
			switch c {
			case '\\':
				if i+1 == len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
					return "", fmt.Errorf("%w: bad escape in quoted string", ErrBadKey)
				}
				i++
				b.WriteByte(inner[i])
			case '"':
				return "", fmt.Errorf("%w: unescaped quote inside quoted string", ErrBadKey)
			default:
				b.WriteByte(c)
			}
		}
		key = b.String()
	}
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// ValidateKey reports, wrapping [ErrBadKey], why key is not a key: empty,
// longer than [MaxKeyLen], or a character outside ASCII letters, digits
// and -_.:~+/=.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrBadKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrBadKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if !keyChar(key[i]) {
			return fmt.Errorf("%w: character %q at byte %d: only letters, digits and -_.:~+/=", ErrBadKey, key[i], i)
		}
	}
	return nil
}

func keyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.:~+/=", c) >= 0
}

// FormatKey returns key as the header value a client sends: an sf-string.
func FormatKey(key string) string { return `"` + key + `"` }

// Scope is a key as the store holds it: the principal the request was
// authenticated as, its method and route, and the client's key. Two
// requests share a stored answer only if all four are equal.
type Scope struct {
	Principal, Method, Route, Key string
}

// Hash is the store's primary key for s: the SHA-256 of its four parts,
// each prefixed with its length, so no two scopes can meet in one hash by
// moving a separator.
func (s Scope) Hash() [32]byte {
	h := sha256.New()
	var n [4]byte
	for _, p := range []string{s.Principal, s.Method, s.Route, s.Key} {
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// ID is a stable identifier derived from s, usable as a message ID
// (inbox.ValidateID): "idem:" and the first 24 bytes of [Scope.Hash] in
// hex. Every retry of one scoped key derives the same ID; two tenants
// with the same key derive different ones.
func (s Scope) ID() string {
	h := s.Hash()
	return "idem:" + hex.EncodeToString(h[:24])
}
