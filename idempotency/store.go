package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// DefaultRetention is how long a key is kept at least: 24 hours, as
// Stripe keeps them. A client must not retry a request with the same key
// for longer than the retention in use.
const DefaultRetention = 24 * time.Hour

// Answer is a stored response: what a replay sends.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
	// Created is when the key was claimed, by the database's clock.
	Created time.Time
}

// Stored is what a store holds for a scoped key.
type Stored struct {
	Answer
	Fingerprint Fingerprint
}

// Sentinel errors of the stores.
var (
	// ErrBusy is returned by a store's Claim when another transaction
	// held the key for longer than the wait: the first request is still
	// running. The transaction is unusable; roll it back.
	ErrBusy = errors.New("idempotency: the key is held by a request still in flight")
	// ErrNotMigrated is returned by a store's CheckSchema when the key
	// table is missing or older than the store's package.
	ErrNotMigrated = errors.New("idempotency: schema not migrated (run `jetinbox intake -migrate` or apply the store's MigrationSQL)")
	// ErrUnsafeHorizon is returned by Prune for a horizon shorter than
	// the retention in use.
	ErrUnsafeHorizon = errors.New("idempotency: prune horizon shorter than the retention")
)

// Component is the name the key table's migrations are recorded under in
// jetinbox_migrations.
const Component = "idempotency"

// Store is the key table in one database, whose transactions are of type
// Tx (pgx.Tx on PostgreSQL, *sql.Tx on SQLite). The handler's work and the
// key share one transaction: Begin, Claim, the handler, Complete, Commit.
type Store[Tx any] interface {
	// Begin starts the transaction a request runs in. It waits at most
	// wait for the database (SQLite's one writer), returning an error
	// wrapping [ErrBusy] past it.
	Begin(ctx context.Context, wait time.Duration) (Tx, error)
	// Claim inserts the key's row in tx with INSERT … ON CONFLICT DO
	// NOTHING. It returns nil, nil when tx now holds the key (run the
	// handler), or what a committed request stored under it (replay, or
	// 422 on another fingerprint). A concurrent transaction holding the
	// key makes it wait, at most wait; past it the error wraps [ErrBusy].
	Claim(ctx context.Context, tx Tx, s Scope, fp Fingerprint, wait time.Duration) (*Stored, error)
	// Complete stores the answer of the key tx claimed, in tx.
	Complete(ctx context.Context, tx Tx, s Scope, a Answer) error
	// ReadPriorCommits makes tx's commit wait, as a writing one does,
	// until what committed before it is as durable as a fresh commit
	// would be: a replayed answer rests on an earlier commit, perhaps one
	// whose wait for PostgreSQL's synchronous standby was cancelled
	// (committed on the primary only). A store with no standby to wait
	// for does nothing.
	ReadPriorCommits(ctx context.Context, tx Tx) error
	// Commit and Rollback end tx. A Commit that cannot say the
	// transaction is durable (on PostgreSQL, success with the warning of
	// a cancelled wait for the synchronous standby) returns an error: the
	// outcome is unknown.
	Commit(ctx context.Context, tx Tx) error
	Rollback(ctx context.Context, tx Tx) error
	// Lookup reads what is stored under s, outside any request: nil when
	// nothing committed.
	Lookup(ctx context.Context, s Scope) (*Stored, error)
}

// PruneOptions configures a store's Prune.
type PruneOptions struct {
	// OlderThan deletes keys claimed more than this long ago. It must be
	// at least Retention. Required.
	OlderThan time.Duration
	// Retention is the retention the service states to its clients (how
	// long they may retry with one key). Default [DefaultRetention].
	Retention time.Duration
	// BatchSize is how many rows one DELETE removes. Default 10000.
	BatchSize int
}

// Checked returns o with its defaults filled in, or an error wrapping
// [ErrUnsafeHorizon] for an OlderThan shorter than the retention. Every
// store checks its options with it before deleting, as
// inbox.PruneOptions.Checked does for the inbox.
func (o PruneOptions) Checked() (PruneOptions, error) {
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.OlderThan < o.Retention {
		return o, fmt.Errorf("%w: OlderThan %v is shorter than the retention %v: a client retrying inside it would run its request again", ErrUnsafeHorizon, o.OlderThan, o.Retention)
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 10000
	}
	return o, nil
}

// EncodeHeader is the stored form of an answer's headers: "Name: value"
// lines.
func EncodeHeader(h http.Header) string {
	var b []byte
	for k, vs := range h {
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, '\n')
		}
	}
	return string(b)
}

// DecodeHeader reads EncodeHeader's form back.
func DecodeHeader(s string) http.Header {
	h := http.Header{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			h.Add(k, v)
		}
	}
	return h
}
