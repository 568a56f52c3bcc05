// Package shard spreads one intents stream over several databases: a
// subject transform on the stream puts a partition number in every stored
// subject, a shard map gives each partition to one shard (its own
// PostgreSQL primary, one durable per partition), and every consumer checks
// that the partition a message was stored under is the one its ID belongs
// to, so that every applied copy of an ID is in one partition, and so in
// one shard's inbox. docs/sharding.md says why it is built this way.
package shard

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// KeyLen is the length of a key token: 16 hex digits of the ID's SHA-256.
const KeyLen = 16

// DefaultPartitions is the partition count of a new map: generous, so that
// shards can be added for a long time by moving partitions, never by
// re-partitioning the stream.
const DefaultPartitions = 64

// Key returns the key token of a message ID: the first 8 bytes of its
// SHA-256, in hex. An ID may hold any printable character and be 200 bytes
// long; its key is always a valid subject token of fixed length.
func Key(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:KeyLen/2])
}

// Partition is the partition NATS's subject transform function
// partition(n, token) gives a subject whose token is key: FNV-1a (32 bits)
// of the token, modulo n. It must stay the server's function; a test holds
// it to a real server's transform.
func Partition(key string, n int) int {
	if n <= 0 {
		return 0 // the server's answer for a zero count, "0"
	}
	// FNV-1a, 32 bits, as hash/fnv's New32a computes it, without its
	// allocation: this runs once per message.
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// PartitionOf returns the partition of a message ID among n.
func PartitionOf(id string, n int) int { return Partition(Key(id), n) }

// PublishSubject returns the subject a producer publishes an intent on:
// prefix, the ID's key token, then rest (one or more tokens naming the
// intent's kind, e.g. "ledger.7"). The stream's transform inserts the
// partition after prefix.
func PublishSubject(prefix, id, rest string) string {
	return prefix + "." + Key(id) + "." + rest
}

// StoredSubject is the subject the stream stores a publish on
// PublishSubject(prefix, id, rest) under, partition inserted.
func StoredSubject(prefix, id, rest string, n int) string {
	k := Key(id)
	return prefix + "." + strconv.Itoa(Partition(k, n)) + "." + k + "." + rest
}

// ErrBinding wraps every reason a stored message breaks the binding of its
// ID to its partition.
var ErrBinding = errors.New("shard: message not bound to its ID's partition")

// Parsed is a stored subject cut into its parts.
type Parsed struct {
	Partition int
	Key       string
	// Rest is what follows the key token.
	Rest string
}

// ParseStored cuts a stored subject: prefix, partition, key, rest.
func ParseStored(prefix, subject string) (Parsed, error) {
	tail, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return Parsed{}, fmt.Errorf("%w: subject %q is not under %q", ErrBinding, cut(subject), prefix)
	}
	ptok, tail, ok1 := strings.Cut(tail, ".")
	key, rest, ok2 := strings.Cut(tail, ".")
	if !ok1 || !ok2 || rest == "" {
		return Parsed{}, fmt.Errorf("%w: subject %q lacks the partition, key or kind token (want %s.<partition>.<key>.<kind>)", ErrBinding, cut(subject), prefix)
	}
	p, err := strconv.Atoi(ptok)
	if err != nil || p < 0 || strconv.Itoa(p) != ptok {
		return Parsed{}, fmt.Errorf("%w: subject %q: partition token %q is not a partition number", ErrBinding, cut(subject), cut(ptok))
	}
	return Parsed{Partition: p, Key: key, Rest: rest}, nil
}

// Check reports whether a message stored on subject with ID id is bound to
// its partition among n: the key token is Key(id) and the partition token
// is the server's partition of that key. It returns the partition. The
// cost is one SHA-256 and one FNV of short strings, no round trip.
func Check(prefix string, n int, id, subject string) (int, error) {
	ps, err := ParseStored(prefix, subject)
	if err != nil {
		return 0, err
	}
	var key [KeyLen]byte
	sum := sha256.Sum256([]byte(id))
	hex.Encode(key[:], sum[:KeyLen/2])
	if ps.Key != string(key[:]) {
		want := string(key[:])
		return 0, fmt.Errorf("%w: key token %q is not the key of ID %q (%s): published on a subject not derived from its ID", ErrBinding, cut(ps.Key), cut(id), want)
	}
	if want := Partition(ps.Key, n); ps.Partition != want {
		return 0, fmt.Errorf("%w: stored under partition %d, but key %s belongs to partition %d of %d: the stream's transform is not partition(%d) of the key token", ErrBinding, ps.Partition, ps.Key, want, n, n)
	}
	return ps.Partition, nil
}

// Unstored returns the subject to publish a stored message on again (a
// dead letter re-driven): the stored subject without its partition token,
// which the stream's transform puts back.
func Unstored(prefix, subject string) (string, error) {
	ps, err := ParseStored(prefix, subject)
	if err != nil {
		return "", err
	}
	return prefix + "." + ps.Key + "." + ps.Rest, nil
}

// cut keeps what goes into a reason short.
func cut(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
