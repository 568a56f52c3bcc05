package idemtest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/idempotency"
)

// failingCommit makes the next fail commits roll back and fail, as a
// process that died before COMMIT (or lost its database) leaves them.
type failingCommit[Tx any] struct {
	idempotency.Store[Tx]
	fail *atomic.Int64
}

func (f *failingCommit[Tx]) Commit(ctx context.Context, tx Tx) error {
	if f.fail.Add(-1) >= 0 {
		_ = f.Store.Rollback(ctx, tx)
		return errors.New("idemtest: the process died before COMMIT")
	}
	f.fail.Add(1)
	return f.Store.Commit(ctx, tx)
}

// keyOutsideTx claims the key and stores its answer in a transaction of
// its own, committed before the handler's: the shape of a middleware that
// keeps its records apart from the effect.
type keyOutsideTx[Tx any] struct {
	idempotency.Store[Tx]
	mu   sync.Mutex
	mine map[[32]byte]Tx
}

func (k *keyOutsideTx[Tx]) Claim(ctx context.Context, _ Tx, s idempotency.Scope, fp idempotency.Fingerprint, wait time.Duration) (*idempotency.Stored, error) {
	tx2, err := k.Store.Begin(ctx, wait)
	if err != nil {
		return nil, err
	}
	st, err := k.Store.Claim(ctx, tx2, s, fp, wait)
	if err != nil || st != nil {
		_ = k.Store.Rollback(ctx, tx2)
		return st, err
	}
	k.mu.Lock()
	k.mine[s.Hash()] = tx2
	k.mu.Unlock()
	return nil, nil
}

func (k *keyOutsideTx[Tx]) Complete(ctx context.Context, _ Tx, s idempotency.Scope, a idempotency.Answer) error {
	k.mu.Lock()
	tx2 := k.mine[s.Hash()]
	delete(k.mine, s.Hash())
	k.mu.Unlock()
	if err := k.Store.Complete(ctx, tx2, s, a); err != nil {
		return err
	}
	return k.Store.Commit(ctx, tx2)
}

// noFingerprint replays whatever is stored under the key, whatever the
// request: the shape of middleware without a fingerprint.
type noFingerprint[Tx any] struct{ idempotency.Store[Tx] }

func (n noFingerprint[Tx]) Claim(ctx context.Context, tx Tx, s idempotency.Scope, fp idempotency.Fingerprint, wait time.Duration) (*idempotency.Stored, error) {
	st, err := n.Store.Claim(ctx, tx, s, fp, wait)
	if st != nil {
		st.Fingerprint = fp
	}
	return st, err
}

// storesTransient commits a rolled-back request's claim with a 503: the
// shape of a store that keeps transient answers.
type storesTransient[Tx any] struct {
	idempotency.Store[Tx]
	mu      sync.Mutex
	claimed map[any]idempotency.Scope
}

func (s *storesTransient[Tx]) Claim(ctx context.Context, tx Tx, sc idempotency.Scope, fp idempotency.Fingerprint, wait time.Duration) (*idempotency.Stored, error) {
	st, err := s.Store.Claim(ctx, tx, sc, fp, wait)
	if err == nil && st == nil {
		s.mu.Lock()
		s.claimed[any(tx)] = sc
		s.mu.Unlock()
	}
	return st, err
}

func (s *storesTransient[Tx]) Commit(ctx context.Context, tx Tx) error {
	s.mu.Lock()
	delete(s.claimed, any(tx))
	s.mu.Unlock()
	return s.Store.Commit(ctx, tx)
}

func (s *storesTransient[Tx]) Rollback(ctx context.Context, tx Tx) error {
	s.mu.Lock()
	sc, ok := s.claimed[any(tx)]
	delete(s.claimed, any(tx))
	s.mu.Unlock()
	if ok {
		if err := s.Store.Complete(ctx, tx, sc, idempotency.Answer{Status: 503}); err == nil {
			return s.Store.Commit(ctx, tx)
		}
	}
	return s.Store.Rollback(ctx, tx)
}

// readThenWrite looks for a committed answer and, finding none, runs the
// handler, claiming the key only when it stores the answer: the shape of
// a check-then-insert without a lock.
type readThenWrite[Tx any] struct {
	idempotency.Store[Tx]
	look idempotency.Store[Tx] // reads on connections of its own
	fp   sync.Map
}

func (r *readThenWrite[Tx]) Claim(ctx context.Context, _ Tx, s idempotency.Scope, fp idempotency.Fingerprint, _ time.Duration) (*idempotency.Stored, error) {
	r.fp.Store(s.Hash(), fp)
	return r.look.Lookup(ctx, s)
}

func (r *readThenWrite[Tx]) Complete(ctx context.Context, tx Tx, s idempotency.Scope, a idempotency.Answer) error {
	fp, _ := r.fp.Load(s.Hash())
	if _, err := r.Store.Claim(ctx, tx, s, fp.(idempotency.Fingerprint), time.Minute); err != nil {
		return err
	}
	return r.Store.Complete(ctx, tx, s, a)
}

// noScope keys by the client's key alone: the shape of a store shared by
// tenants.
type noScope[Tx any] struct{ idempotency.Store[Tx] }

func unscoped(s idempotency.Scope) idempotency.Scope { s.Principal = ""; return s }

func (n noScope[Tx]) Claim(ctx context.Context, tx Tx, s idempotency.Scope, fp idempotency.Fingerprint, wait time.Duration) (*idempotency.Stored, error) {
	return n.Store.Claim(ctx, tx, unscoped(s), fp, wait)
}

func (n noScope[Tx]) Complete(ctx context.Context, tx Tx, s idempotency.Scope, a idempotency.Answer) error {
	return n.Store.Complete(ctx, tx, unscoped(s), a)
}

func (n noScope[Tx]) Lookup(ctx context.Context, s idempotency.Scope) (*idempotency.Stored, error) {
	return n.Store.Lookup(ctx, unscoped(s))
}

// mutations breaks one part at a time and checks that the guarantee
// scenario for it turns red.
func (s suite[Tx]) mutations(t *testing.T) {
	type mutation struct {
		name string
		wrap func(DB[Tx], idempotency.Store[Tx]) idempotency.Store[Tx]
		sc   scenario[Tx]
	}
	ms := []mutation{
		{"no-fingerprint-check", func(_ DB[Tx], st idempotency.Store[Tx]) idempotency.Store[Tx] { return noFingerprint[Tx]{st} }, fingerprintScenario[Tx]},
		{"transient-503-stored", func(_ DB[Tx], st idempotency.Store[Tx]) idempotency.Store[Tx] {
			return &storesTransient[Tx]{Store: st, claimed: map[any]idempotency.Scope{}}
		}, transientScenario[Tx]},
		{"scope-left-out", func(_ DB[Tx], st idempotency.Store[Tx]) idempotency.Store[Tx] { return noScope[Tx]{st} }, scopeScenario[Tx]},
	}
	if s.h.SecondWriter {
		// On SQLite one writer serializes whole requests: a second
		// transaction can neither commit a key beside the handler's nor
		// read while a duplicate runs, so these shapes cannot be built
		// there.
		ms = append(ms,
			mutation{"key-outside-handler-tx", func(_ DB[Tx], st idempotency.Store[Tx]) idempotency.Store[Tx] {
				return &keyOutsideTx[Tx]{Store: st, mine: map[[32]byte]Tx{}}
			}, crashScenario[Tx]},
			mutation{"concurrent-duplicate-runs-twice", func(db DB[Tx], st idempotency.Store[Tx]) idempotency.Store[Tx] {
				return &readThenWrite[Tx]{Store: st, look: db.Store()}
			}, concurrentScenario[Tx]},
		)
	}
	for _, m := range ms {
		t.Run(m.name, func(t *testing.T) {
			e := s.newEnv(t)
			e.wrap = m.wrap
			err := m.sc(context.Background(), e)
			if err == nil {
				t.Fatalf("mutation %s went unnoticed: its guarantee test cannot fail", m.name)
			}
			t.Logf("mutation %s caught: %v", m.name, err)
		})
	}
}
