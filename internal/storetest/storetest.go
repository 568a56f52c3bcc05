// Package storetest is the conformance suite of the inbox stores: the
// guarantee tests of the inbox and the ledger, the crash points and the
// mutation tests, written once against [driver.Store] and run on every
// store (PostgreSQL and SQLite) by that store's tests.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/hook"
)

// Accounts is how many ledger accounts a fresh database has (1..Accounts).
const Accounts = 1024

// Harness is one store under test.
type Harness[TX any] struct {
	// Open returns a fresh database, migrated, with accounts
	// 1..[Accounts].
	Open func(t testing.TB) DB[TX]
	// Ledger returns the ledger effect for this store.
	Ledger func() inbox.Handler[TX]
	// PlantBlindClaim breaks s (a store DB.Store returned): its claim
	// skips IDs already there yet reports every claim fresh.
	PlantBlindClaim func(s driver.Store[TX])
	// Abort runs a statement in tx that fails for this message alone
	// with a data error; AbortReason is a part of its message.
	Abort       func(ctx context.Context, tx TX) error
	AbortReason string
	// SecondWriter: a second transaction can commit while a batch's
	// transaction is open (PostgreSQL). SQLite has one writer a file, so
	// an effect outside the batch's transaction cannot commit there.
	SecondWriter bool
	// CopyThreshold is the batch size from which the store claims with
	// its bulk path (PostgreSQL's COPY); 0 if it has none. The guarantee
	// scenario checks which path its batches took, so that the bulk path
	// is the one under test where it should be.
	CopyThreshold int
}

// DB is one fresh database of a harness.
type DB[TX any] struct {
	// Store returns a new store on the database, as another process would
	// hold: its own connections.
	Store func() driver.Store[TX]
	// Snapshot reads what the database holds now.
	Snapshot func(t testing.TB) Snapshot
	// Migrate migrates the inbox and the ledger again; CheckSchema checks
	// the inbox's.
	Migrate     func(ctx context.Context) (int, error)
	CheckSchema func(ctx context.Context) error
	// Prune runs the store's prune; Age makes every inbox row older by d.
	Prune func(ctx context.Context, opts inbox.PruneOptions) (int64, error)
	Age   func(t testing.TB, d time.Duration)
}

// Snapshot is what a database holds, for the invariants.
type Snapshot struct {
	// Rows: inbox rows of scope "ledger", by message ID: "applied" or
	// "rejected".
	Rows map[string]string
	// Entries: ledger entries per message ID (any scope), and their
	// scopes.
	Entries      map[string]int
	EntryScopes  map[string][]string
	Balances     map[int64]int64
	Conflicts    map[string]int // inbox_conflicts rows per message ID
	ScopesOfRows map[string][]string
}

// Run runs the suite on h.
func Run[TX any](t *testing.T, h Harness[TX]) {
	s := suite[TX]{h}
	for _, tc := range []struct {
		name string
		f    func(t *testing.T)
	}{
		{"ClaimFreshDuplicateConflict", s.claimStates},
		{"ConcurrentClaimWaits", s.concurrentClaim},
		{"ProcessMixedBatch", s.mixedBatch},
		{"PoisonDoesNotStallNeighbours", s.poison},
		{"CrashBeforeCommit", s.crashBeforeCommit},
		{"CommitOutcomeUnknownIsNotAckable", s.commitUnknown},
		{"TwoProcessorsOneInbox", s.twoProcessors},
		{"GuaranteeScenarioClean", s.scenarioClean},
		{"MutationsAreCaught", s.mutations},
		{"LedgerEntriesCarryTheScope", s.ledgerScope},
		{"Prune", s.prune},
		{"MigrateIdempotent", s.migrate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f(t)
		})
	}
}

type suite[TX any] struct{ h Harness[TX] }

// Intent is a ledger message: amount to account, on its first delivery.
func Intent(id string, account, amount int64) inbox.Message {
	return inbox.Message{ID: id, Payload: effects.Intent{Account: account, Amount: amount}.AppendJSON(nil), Deliveries: 1}
}

// Statuses lists the outcomes' statuses, comma separated.
func Statuses(out []inbox.Outcome) string {
	s := make([]string, len(out))
	for i, o := range out {
		s[i] = o.Status.String()
	}
	return strings.Join(s, ",")
}

func (s suite[TX]) processor(t testing.TB, st driver.Store[TX], h inbox.Handler[TX]) *inbox.Processor[TX] {
	t.Helper()
	if h == nil {
		h = s.h.Ledger()
	}
	p, err := inbox.NewProcessor(st, h, inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Violations compares snap with the intents that should have been applied
// once each and returns every broken invariant: duplicated or missing
// effects, effects without an applied inbox row, applied rows without an
// effect, balances that do not add up.
func Violations(t testing.TB, snap Snapshot, want map[string]inbox.Message) []string {
	var v []string
	for id, n := range snap.Entries {
		if n > 1 {
			v = append(v, fmt.Sprintf("duplicated: %s has %d ledger entries", id, n))
		}
		if snap.Rows[id] != "applied" {
			v = append(v, fmt.Sprintf("effect without applied inbox row: %s", id))
		}
		if _, ok := want[id]; !ok {
			v = append(v, fmt.Sprintf("unexpected: %s applied", id))
		}
	}
	for id := range want {
		if snap.Entries[id] == 0 {
			v = append(v, fmt.Sprintf("lost: %s not applied", id))
		}
	}
	orphans := 0
	for id, st := range snap.Rows {
		if st == "applied" && snap.Entries[id] == 0 {
			orphans++
		}
	}
	if orphans > 0 {
		v = append(v, fmt.Sprintf("%d applied inbox rows without an effect", orphans))
	}
	wantBal := map[int64]int64{}
	for _, m := range want {
		in, err := effects.ParseIntent(m.Payload)
		if err != nil {
			t.Fatal(err)
		}
		wantBal[in.Account] += in.Amount
	}
	for id, bal := range snap.Balances {
		if bal != wantBal[id] {
			v = append(v, fmt.Sprintf("account %d balance %d, want %d", id, bal, wantBal[id]))
		}
	}
	sort.Strings(v)
	return v
}

func assertClean[TX any](t *testing.T, db DB[TX], want map[string]inbox.Message) {
	t.Helper()
	if v := Violations(t, db.Snapshot(t), want); len(v) > 0 {
		t.Fatalf("invariants broken:\n%s", strings.Join(v, "\n"))
	}
}

func claimOne[TX any](t *testing.T, st driver.Store[TX], scope string, c driver.Claim) driver.ClaimResult {
	t.Helper()
	ctx := context.Background()
	tx, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Claim(ctx, tx, scope, []driver.Claim{c})
	if err != nil {
		_ = st.Rollback(ctx, tx)
		t.Fatal(err)
	}
	if err := st.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return res[0]
}

func (s suite[TX]) claimStates(t *testing.T) {
	db := s.h.Open(t)
	st := db.Store()
	fp := inbox.Fingerprint([]byte("a"))
	c := driver.Claim{ID: "m1", Fingerprint: fp, StreamSeq: 7, Subject: "x.y"}
	if r := claimOne(t, st, "s", c); r.State != driver.ClaimFresh {
		t.Fatalf("first claim: %v", r.State)
	}
	if r := claimOne(t, st, "s", c); r.State != driver.ClaimDuplicate || r.PriorStatus != driver.RowApplied || r.PriorSeq != 7 || r.PriorSubject != "x.y" {
		t.Fatalf("second claim: %+v", r)
	}
	// The subject is part of the intent's identity: the same ID and
	// payload on another subject is a reuse of the ID, not a repeat.
	other := c
	other.Subject = "x.z"
	if r := claimOne(t, st, "s", other); r.State != driver.ClaimConflict || r.PriorSubject != "x.y" {
		t.Fatalf("same payload, other subject: %+v, want a conflict", r)
	}
	c.Fingerprint = inbox.Fingerprint([]byte("b"))
	if r := claimOne(t, st, "s", c); r.State != driver.ClaimConflict {
		t.Fatalf("other payload: %v", r.State)
	}
	if r := claimOne(t, st, "other", c); r.State != driver.ClaimFresh {
		t.Fatalf("other scope: %v", r.State)
	}
	// One call with copies of one ID, and an ID already there.
	ctx := context.Background()
	tx, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Rollback(ctx, tx) //nolint:errcheck
	res, err := st.Claim(ctx, tx, "s", []driver.Claim{
		{ID: "n1", Fingerprint: fp}, {ID: "m1", Fingerprint: fp, Subject: "x.y"}, {ID: "n1", Fingerprint: fp}, {ID: "n1", Fingerprint: c.Fingerprint},
		{ID: "n1", Fingerprint: fp, Subject: "x.z"},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(res[0].State, res[1].State, res[2].State, res[2].InBatch, res[2].First, res[3].State, res[4].State)
	if want := fmt.Sprint(driver.ClaimFresh, driver.ClaimDuplicate, driver.ClaimDuplicate, true, 0, driver.ClaimConflict, driver.ClaimConflict); got != want {
		t.Fatalf("batch claim: %s, want %s", got, want)
	}
}

// concurrentClaim: two transactions of two stores claim one ID; the second
// waits for the first, then sees a duplicate if the first commits, or
// claims it fresh if the first rolls back.
func (s suite[TX]) concurrentClaim(t *testing.T) {
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "first-commits", false: "first-rolls-back"}[commit], func(t *testing.T) {
			db := s.h.Open(t)
			st1, st2 := db.Store(), db.Store()
			ctx := context.Background()
			c := driver.Claim{ID: "same", Fingerprint: inbox.Fingerprint([]byte("p"))}
			tx1, err := st1.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if r, err := st1.Claim(ctx, tx1, "s", []driver.Claim{c}); err != nil || r[0].State != driver.ClaimFresh {
				t.Fatalf("first claim: %v %v", r, err)
			}
			got := make(chan driver.ClaimState, 1)
			go func() {
				tx2, err := st2.Begin(ctx)
				if err != nil {
					t.Error(err)
					got <- 0
					return
				}
				defer st2.Rollback(ctx, tx2) //nolint:errcheck
				r, err := st2.Claim(ctx, tx2, "s", []driver.Claim{c})
				if err != nil {
					t.Error(err)
					got <- 0
					return
				}
				got <- r[0].State
			}()
			select {
			case st := <-got:
				t.Fatalf("second claim returned %v while the first was open", st)
			case <-time.After(300 * time.Millisecond):
			}
			want := driver.ClaimDuplicate
			if commit {
				err = st1.Commit(ctx, tx1)
			} else {
				err, want = st1.Rollback(ctx, tx1), driver.ClaimFresh
			}
			if err != nil {
				t.Fatal(err)
			}
			if st := <-got; st != want {
				t.Fatalf("second claim: %v, want %v", st, want)
			}
		})
	}
}

func (s suite[TX]) mixedBatch(t *testing.T) {
	db := s.h.Open(t)
	ctx := context.Background()
	p := s.processor(t, db.Store(), nil)
	first := []inbox.Message{Intent("dup", 1, 100), Intent("conflict", 2, 200)}
	if out, err := p.Process(ctx, first); err != nil || Statuses(out) != "applied,applied" {
		t.Fatalf("setup batch: %s, %v", Statuses(out), err)
	}
	batch := []inbox.Message{
		Intent("fresh-1", 3, 10),
		Intent("dup", 1, 100),
		Intent("conflict", 2, 999),
		{ID: "bad-json", Payload: []byte(`{"account":1,`)},
		Intent("unknown-account", 99999, 5),
		Intent("fresh-2", 3, 20),
		{ID: "", Payload: []byte(`{}`)},
		Intent("fresh-1", 3, 10),
	}
	out, err := p.Process(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Statuses(out), "applied,duplicate,conflict,rejected,rejected,applied,rejected,duplicate"; got != want {
		t.Fatalf("outcomes %s, want %s", got, want)
	}
	for _, i := range []int{3, 4, 6} {
		if out[i].Reason == "" {
			t.Errorf("rejection %d has no reason", i)
		}
	}
	if !strings.Contains(out[4].Reason, "unknown account 99999") || out[4].Cause != inbox.CauseBadInput {
		t.Errorf("unknown account: %q %v", out[4].Reason, out[4].Cause)
	}
	assertClean(t, db, map[string]inbox.Message{"dup": first[0], "conflict": first[1], "fresh-1": batch[0], "fresh-2": batch[5]})
	snap := db.Snapshot(t)
	rejected := 0
	for _, st := range snap.Rows {
		if st == "rejected" {
			rejected++
		}
	}
	if rejected != 2 || snap.Conflicts["conflict"] != 1 {
		t.Fatalf("rejected rows %d (want 2), conflict rows %d (want 1)", rejected, snap.Conflicts["conflict"])
	}
	// Redelivering a rejected message reports the stored rejection again.
	out, err = p.Process(ctx, batch[3:4])
	if err != nil || out[0].Status != inbox.StatusRejected || !out[0].AlreadyInInbox || out[0].Reason == "" {
		t.Fatalf("redelivered poison: %+v, %v", out[0], err)
	}
}

// poison: effects that panic or fail a statement are isolated; their
// neighbours commit; a transient failure leaves no claim and becomes a
// rejection on the final delivery.
func (s suite[TX]) poison(t *testing.T) {
	db := s.h.Open(t)
	ctx := context.Background()
	ledger := s.h.Ledger()
	h := inbox.HandlerFunc(func(ctx context.Context, tx TX, m inbox.Message) error {
		switch m.ID {
		case "panics":
			panic("boom")
		case "aborts":
			return s.h.Abort(ctx, tx)
		case "transient":
			return errors.New("downstream busy")
		}
		errs := make([]error, 1)
		if err := ledger.Handle(ctx, tx, []inbox.Message{m}, errs); err != nil {
			return err
		}
		return errs[0]
	})
	p := s.processor(t, db.Store(), h)
	batch := []inbox.Message{Intent("ok-1", 1, 5), Intent("panics", 1, 5), Intent("aborts", 1, 5), Intent("transient", 1, 5), Intent("ok-2", 2, 7)}
	out, err := p.Process(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Statuses(out), "applied,rejected,rejected,retry,applied"; got != want {
		t.Fatalf("outcomes %s, want %s", got, want)
	}
	if !strings.Contains(out[1].Reason, "panicked") || !strings.Contains(out[2].Reason, s.h.AbortReason) {
		t.Fatalf("reasons: %q / %q", out[1].Reason, out[2].Reason)
	}
	assertClean(t, db, map[string]inbox.Message{"ok-1": batch[0], "ok-2": batch[4]})
	if _, ok := db.Snapshot(t).Rows["transient"]; ok {
		t.Fatal("the retried message left its claim behind")
	}
	final := batch[3]
	final.Final, final.Deliveries = true, 5
	out, err = p.Process(ctx, []inbox.Message{final})
	if err != nil || out[0].Status != inbox.StatusRejected || !strings.Contains(out[0].Reason, "gave up after 5 deliveries") {
		t.Fatalf("final delivery: %+v, %v", out[0], err)
	}
}

// crashBeforeCommit: a crash at any point before COMMIT leaves neither the
// inbox row nor the effect; the retry applies once; a duplicate changes
// nothing.
func (s suite[TX]) crashBeforeCommit(t *testing.T) {
	for _, pt := range []hook.Point{failpoint.BeforeClaim, failpoint.BeforeCommit} {
		t.Run(pt.String(), func(t *testing.T) {
			db := s.h.Open(t)
			p := s.processor(t, db.Store(), nil)
			fp := failpoint.New()
			fp.Enable(pt, 1)
			fp.Attach(p)
			ctx := context.Background()
			m := Intent("k1", 1, 100)
			out, err := p.Process(ctx, []inbox.Message{m})
			if !failpoint.IsCrash(err) || out[0].Status != inbox.StatusRetry || out[0].Ackable() {
				t.Fatalf("crashed attempt: %+v, %v", out[0], err)
			}
			assertClean(t, db, map[string]inbox.Message{})
			if out, err = p.Process(ctx, []inbox.Message{m}); err != nil || out[0].Status != inbox.StatusApplied {
				t.Fatalf("retry: %+v, %v", out[0], err)
			}
			if out, err = p.Process(ctx, []inbox.Message{m}); err != nil || out[0].Status != inbox.StatusDuplicate {
				t.Fatalf("duplicate: %+v, %v", out[0], err)
			}
			assertClean(t, db, map[string]inbox.Message{"k1": m})
		})
	}
}

// commitUnknown: a batch stopped right after COMMIT (the process died
// before acking) is not ackable; the redelivery, by another processor, finds
// the rows and applies nothing twice.
func (s suite[TX]) commitUnknown(t *testing.T) {
	db := s.h.Open(t)
	p := s.processor(t, db.Store(), nil)
	fp := failpoint.New()
	fp.Enable(failpoint.AfterCommit, 1)
	fp.Attach(p)
	ctx := context.Background()
	batch := []inbox.Message{Intent("a", 1, 1), Intent("b", 2, 2)}
	out, err := p.Process(ctx, batch)
	if !errors.Is(err, inbox.ErrOutcomeUnknown) || out[0].Ackable() || out[1].Ackable() {
		t.Fatalf("after-commit crash: %s, %v", Statuses(out), err)
	}
	out, err = s.processor(t, db.Store(), nil).Process(ctx, batch)
	if err != nil || Statuses(out) != "duplicate,duplicate" {
		t.Fatalf("redelivery: %s, %v", Statuses(out), err)
	}
	assertClean(t, db, map[string]inbox.Message{"a": batch[0], "b": batch[1]})
}

// twoProcessors: two processors on two stores (as two processes) process
// overlapping batches at once; every intent is applied exactly once.
func (s suite[TX]) twoProcessors(t *testing.T) {
	db := s.h.Open(t)
	ctx := context.Background()
	procs := []*inbox.Processor[TX]{s.processor(t, db.Store(), nil), s.processor(t, db.Store(), nil)}
	want := map[string]inbox.Message{}
	var all []inbox.Message
	for i := range 400 {
		m := Intent(fmt.Sprintf("c%04d", i), int64(1+i%13), int64(1+i%97))
		want[m.ID] = m
		all = append(all, m)
	}
	errs := make(chan error, 2)
	for k, p := range procs {
		go func() {
			msgs := slices.Clone(all)
			if k == 1 {
				slices.Reverse(msgs)
			}
			for len(msgs) > 0 {
				n := min(len(msgs), 30+k*7)
				batch := msgs[:n]
				out, err := p.Process(ctx, batch)
				if err != nil {
					errs <- err
					return
				}
				var again []inbox.Message
				for i, o := range out {
					if !o.Ackable() {
						if o.Status != inbox.StatusRetry {
							errs <- fmt.Errorf("%s: %v %s", batch[i].ID, o.Status, o.Reason)
							return
						}
						again = append(again, batch[i])
					}
				}
				msgs = append(again, msgs[n:]...)
			}
			errs <- nil
		}()
	}
	for range procs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	assertClean(t, db, want)
}

// scenario is how the guarantee scenario builds its processor: by default on
// a store of the database with the ledger; a mutation swaps in a broken
// part.
type scenario[TX any] struct {
	store   func(db DB[TX]) driver.Store[TX]
	handler func(db DB[TX]) inbox.Handler[TX]
	// next is told each batch before it is processed.
	next func(batch []inbox.Message)
}

// guaranteeSizes are the batch sizes the guarantee scenario runs with: one
// small, one big (on PostgreSQL claimed with COPY).
var guaranteeSizes = []int{2, 128}

// runScenario replays a crash before commit, a redelivery after commit and
// a batch with duplicates, then returns the broken invariants.
func (s suite[TX]) runScenario(t *testing.T, n int, sc scenario[TX]) []string {
	db := s.h.Open(t)
	st := db.Store()
	if sc.store != nil {
		st = sc.store(db)
	}
	var h inbox.Handler[TX]
	if sc.handler != nil {
		h = sc.handler(db)
	}
	p := s.processor(t, st, h)
	fp := failpoint.New()
	fp.Enable(failpoint.BeforeCommit, 1)
	fp.Attach(p)
	ctx := context.Background()
	batch := make([]inbox.Message, n)
	want := make(map[string]inbox.Message, n)
	for i := range batch {
		id := fmt.Sprintf("m%04d", i)
		batch[i] = Intent(id, int64(1+i%7), int64(10+i))
		want[id] = batch[i]
	}
	rev := slices.Clone(batch)
	slices.Reverse(rev)
	for _, b := range [][]inbox.Message{batch, batch, rev} {
		if sc.next != nil {
			sc.next(b)
		}
		_, _ = p.Process(ctx, b)
	}
	if copies := p.Stats().CopyClaims; (s.h.CopyThreshold > 0 && n >= s.h.CopyThreshold) != (copies > 0) {
		t.Errorf("%d messages a batch: %d batches claimed with the bulk path (threshold %d)", n, copies, s.h.CopyThreshold)
	}
	return Violations(t, db.Snapshot(t), want)
}

func (s suite[TX]) scenarioClean(t *testing.T) {
	for _, n := range guaranteeSizes {
		t.Run(fmt.Sprintf("batch=%d", n), func(t *testing.T) {
			if v := s.runScenario(t, n, scenario[TX]{}); len(v) > 0 {
				t.Fatalf("violations: %v", v)
			}
		})
	}
}

// effectsFirst is the bug "effect before claim": a store that applies the
// effects of the batch about to be processed as soon as the transaction
// begins, before the claim has looked at the inbox.
type effectsFirst[TX any] struct {
	driver.Store[TX]
	inner inbox.Handler[TX]
	batch []inbox.Message
}

func (b *effectsFirst[TX]) Begin(ctx context.Context) (TX, error) {
	tx, err := b.Store.Begin(ctx)
	if err != nil {
		return tx, err
	}
	if err := b.inner.Handle(ctx, tx, b.batch, make([]error, len(b.batch))); err != nil {
		_ = b.Store.Rollback(ctx, tx)
		var zero TX
		return zero, err
	}
	return tx, nil
}

// outsideTx is the bug "effect outside the inbox transaction": a handler
// that applies the effect in a transaction of its own and commits it.
type outsideTx[TX any] struct {
	st    driver.Store[TX]
	inner inbox.Handler[TX]
}

func (h outsideTx[TX]) Handle(ctx context.Context, _ TX, msgs []inbox.Message, errs []error) error {
	tx, err := h.st.Begin(ctx)
	if err != nil {
		return err
	}
	if err := h.inner.Handle(ctx, tx, msgs, errs); err != nil {
		_ = h.st.Rollback(ctx, tx)
		return err
	}
	return h.st.Commit(ctx, tx)
}

// mutations breaks the processor on purpose, each time with a broken part
// of its own, and checks that the guarantee scenario turns red.
func (s suite[TX]) mutations(t *testing.T) {
	first := &effectsFirst[TX]{inner: s.h.Ledger()}
	type mutation struct {
		name string
		sc   scenario[TX]
	}
	ms := []mutation{
		{"effect-before-claim", scenario[TX]{
			store: func(db DB[TX]) driver.Store[TX] { first.Store = db.Store(); return first },
			next:  func(b []inbox.Message) { first.batch = b },
		}},
		{"blind-claim", scenario[TX]{
			store: func(db DB[TX]) driver.Store[TX] { st := db.Store(); s.h.PlantBlindClaim(st); return st },
		}},
	}
	if s.h.SecondWriter {
		ms = append(ms, mutation{"effect-outside-tx", scenario[TX]{
			handler: func(db DB[TX]) inbox.Handler[TX] { return outsideTx[TX]{st: db.Store(), inner: s.h.Ledger()} },
		}})
	}
	for _, m := range ms {
		for _, n := range guaranteeSizes {
			t.Run(fmt.Sprintf("%s/batch=%d", m.name, n), func(t *testing.T) {
				v := s.runScenario(t, n, m.sc)
				if len(v) == 0 {
					t.Fatalf("mutation %s went unnoticed: the guarantee test cannot fail", m.name)
				}
				t.Logf("mutation %s caught: %d violations, first %s", m.name, len(v), v[0])
			})
		}
	}
}

// ledgerScope: ledger entries carry the processor's scope; two scopes each
// apply one message once.
func (s suite[TX]) ledgerScope(t *testing.T) {
	db := s.h.Open(t)
	ctx := context.Background()
	m := Intent("same", 1, 5)
	for _, scope := range []string{"a", "b", "a"} {
		p, err := inbox.NewProcessor(db.Store(), s.h.Ledger(), inbox.Config{Scope: scope})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Process(ctx, []inbox.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	snap := db.Snapshot(t)
	scopes := slices.Sorted(slices.Values(snap.EntryScopes["same"]))
	if fmt.Sprint(scopes) != "[a b]" || snap.Balances[1] != 10 {
		t.Fatalf("entries of scopes %v, balance %d; want [a b], 10", scopes, snap.Balances[1])
	}
}

func (s suite[TX]) prune(t *testing.T) {
	db := s.h.Open(t)
	ctx := context.Background()
	p := s.processor(t, db.Store(), nil)
	if _, err := p.Process(ctx, []inbox.Message{Intent("old", 1, 1)}); err != nil {
		t.Fatal(err)
	}
	db.Age(t, 48*time.Hour)
	if _, err := p.Process(ctx, []inbox.Message{Intent("new", 1, 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Prune(ctx, inbox.PruneOptions{OlderThan: time.Hour, ReplayHorizon: 2 * time.Hour}); !errors.Is(err, inbox.ErrUnsafeHorizon) {
		t.Fatalf("short horizon: %v", err)
	}
	if _, err := db.Prune(ctx, inbox.PruneOptions{OlderThan: time.Hour}); err == nil {
		t.Fatal("prune without ReplayHorizon succeeded")
	}
	n, err := db.Prune(ctx, inbox.PruneOptions{OlderThan: 24 * time.Hour, ReplayHorizon: time.Hour, BatchSize: 1})
	if err != nil || n != 1 {
		t.Fatalf("pruned %d, %v; want 1", n, err)
	}
	rows := db.Snapshot(t).Rows
	if _, ok := rows["old"]; ok || rows["new"] != "applied" {
		t.Fatalf("rows after prune: %v", rows)
	}
}

func (s suite[TX]) migrate(t *testing.T) {
	db := s.h.Open(t)
	ctx := context.Background()
	if n, err := db.Migrate(ctx); err != nil || n != 0 {
		t.Fatalf("second migrate applied %d, %v", n, err)
	}
	if err := db.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
}
