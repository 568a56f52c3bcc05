package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/effects"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/faultconn"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func claimOne(t *testing.T, pool *pgxpool.Pool, scope string, c inbox.Claim) inbox.ClaimResult {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := inbox.ClaimTx(ctx, tx, scope, []inbox.Claim{c})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return res[0]
}

func TestClaimFreshDuplicateConflict(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	a := inbox.Claim{ID: "m-1", Fingerprint: inbox.Fingerprint([]byte("a"))}
	b := inbox.Claim{ID: "m-1", Fingerprint: inbox.Fingerprint([]byte("b"))}
	if got := claimOne(t, pool, "s", a).State; got != inbox.ClaimFresh {
		t.Fatalf("first claim: %v, want fresh", got)
	}
	if got := claimOne(t, pool, "s", a); got.State != inbox.ClaimDuplicate || got.PriorStatus != inbox.RowApplied {
		t.Fatalf("same ID, same payload: %+v, want duplicate of applied", got)
	}
	if got := claimOne(t, pool, "s", b).State; got != inbox.ClaimConflict {
		t.Fatalf("same ID, other payload: %v, want conflict", got)
	}
	if got := claimOne(t, pool, "other-worker", a).State; got != inbox.ClaimFresh {
		t.Fatalf("same ID in another scope: %v, want fresh", got)
	}
}

func TestClaimBatchOneStatement(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	claimOne(t, pool, "s", inbox.Claim{ID: "old", Fingerprint: inbox.Fingerprint([]byte("x"))})
	claims := []inbox.Claim{
		{ID: "n1", Fingerprint: inbox.Fingerprint([]byte("1"))},
		{ID: "old", Fingerprint: inbox.Fingerprint([]byte("x"))},
		{ID: "n1", Fingerprint: inbox.Fingerprint([]byte("1"))},
		{ID: "n1", Fingerprint: inbox.Fingerprint([]byte("other"))},
		{ID: "old", Fingerprint: inbox.Fingerprint([]byte("y"))},
		{ID: "n2", Fingerprint: inbox.Fingerprint([]byte("2"))},
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	res, err := inbox.ClaimTx(ctx, tx, "s", claims)
	if err != nil {
		t.Fatal(err)
	}
	want := []inbox.ClaimState{inbox.ClaimFresh, inbox.ClaimDuplicate, inbox.ClaimDuplicate, inbox.ClaimConflict, inbox.ClaimConflict, inbox.ClaimFresh}
	for i := range want {
		if res[i].State != want[i] {
			t.Errorf("claim %d (%s): %v, want %v", i, claims[i].ID, res[i].State, want[i])
		}
	}
	if _, err := inbox.ClaimTx(ctx, tx, "s", []inbox.Claim{{ID: "bad id"}}); !errors.Is(err, inbox.ErrInvalidID) {
		t.Fatalf("claim with a space in the ID: %v, want ErrInvalidID", err)
	}
}

// TestPoisonDoesNotStallNeighbours: effects that panic or abort the
// transaction are isolated; their neighbours commit.
func TestPoisonDoesNotStallNeighbours(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	ledger := effects.NewLedger()
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		switch m.ID {
		case "panics":
			panic("boom")
		case "aborts":
			_, err := tx.Exec(ctx, "SELECT 1/0") // aborts the transaction
			return err
		case "transient":
			return errors.New("downstream busy")
		}
		errs := make([]error, 1)
		if err := ledger.Handle(ctx, tx, []inbox.Message{m}, errs); err != nil {
			return err
		}
		return errs[0]
	})
	p, err := inbox.NewProcessor(pool, inbox.Config{Scope: "ledger", Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	batch := []inbox.Message{intent("ok-1", 1, 5), intent("panics", 1, 5), intent("aborts", 1, 5), intent("transient", 1, 5), intent("ok-2", 2, 7)}
	out, err := p.Process(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := statuses(out), "applied,rejected,rejected,retry,applied"; got != want {
		t.Fatalf("outcomes %s, want %s", got, want)
	}
	if !strings.Contains(out[1].Reason, "panicked") || !strings.Contains(out[2].Reason, "division by zero") {
		t.Fatalf("reasons: %q / %q", out[1].Reason, out[2].Reason)
	}
	assertClean(t, pool, map[string]inbox.Message{"ok-1": batch[0], "ok-2": batch[4]})
	// The transient one left no claim behind: a later delivery applies it...
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE message_id = 'transient'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("retried message left %d inbox rows (%v)", n, err)
	}
	// ...and on its final delivery a transient failure becomes a rejection.
	final := batch[3]
	final.Final, final.Deliveries = true, 5
	out, err = p.Process(ctx, []inbox.Message{final})
	if err != nil || out[0].Status != inbox.StatusRejected || !strings.Contains(out[0].Reason, "gave up after 5 deliveries") {
		t.Fatalf("final delivery: %+v, %v", out[0], err)
	}
}

// TestConcurrentClaimWaits: two transactions claim one ID; the second waits
// on the key, then sees a duplicate if the first commits, or claims it fresh
// if the first rolls back.
func TestConcurrentClaimWaits(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		name := map[bool]string{true: "first-commits", false: "first-rolls-back"}[commit]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := newDB(t)
			ctx := context.Background()
			c := inbox.Claim{ID: "same", Fingerprint: inbox.Fingerprint([]byte("p"))}
			tx1, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if r, err := inbox.ClaimTx(ctx, tx1, "s", []inbox.Claim{c}); err != nil || r[0].State != inbox.ClaimFresh {
				t.Fatalf("first claim: %v %v", r, err)
			}
			var pid1 uint32
			if err := tx1.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid1); err != nil {
				t.Fatal(err)
			}
			got := make(chan inbox.ClaimState, 1)
			go func() {
				tx2, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					got <- 0
					return
				}
				defer tx2.Rollback(ctx)
				r, err := inbox.ClaimTx(ctx, tx2, "s", []inbox.Claim{c})
				if err != nil {
					t.Error(err)
					got <- 0
					return
				}
				got <- r[0].State
			}()
			// Wait until the second transaction is blocked by the first.
			deadline := time.Now().Add(10 * time.Second)
			for {
				var blocked bool
				if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`, int(pid1)).Scan(&blocked); err != nil {
					t.Fatal(err)
				}
				if blocked {
					break
				}
				select {
				case s := <-got:
					t.Fatalf("second claim returned %v without waiting for the first", s)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("second claim never blocked")
				}
				time.Sleep(5 * time.Millisecond)
			}
			want := inbox.ClaimDuplicate
			if commit {
				err = tx1.Commit(ctx)
			} else {
				err, want = tx1.Rollback(ctx), inbox.ClaimFresh
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := <-got; s != want {
				t.Fatalf("second claim: %v, want %v", s, want)
			}
		})
	}
}

// TestCrashBeforeCommit: a crash between the claim and COMMIT leaves neither
// the inbox row nor the effect; the retry applies once; a duplicate changes
// nothing (docs/design.md, "Crash points").
func TestCrashBeforeCommit(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	p := newLedgerProcessor(t, pool)
	fp := failpoint.New()
	fp.Enable(failpoint.BeforeCommit, 1)
	fp.Attach(p)
	ctx := context.Background()
	m := intent("k1", 1, 100)

	out, err := p.Process(ctx, []inbox.Message{m})
	if !failpoint.IsCrash(err) || out[0].Status != inbox.StatusRetry || out[0].Ackable() {
		t.Fatalf("crashed attempt: %+v, %v", out[0], err)
	}
	assertClean(t, pool, map[string]inbox.Message{})

	if out, err = p.Process(ctx, []inbox.Message{m}); err != nil || out[0].Status != inbox.StatusApplied {
		t.Fatalf("retry: %+v, %v", out[0], err)
	}
	if out, err = p.Process(ctx, []inbox.Message{m}); err != nil || out[0].Status != inbox.StatusDuplicate {
		t.Fatalf("duplicate: %+v, %v", out[0], err)
	}
	assertClean(t, pool, map[string]inbox.Message{"k1": m})
}

// TestCommitOutcomeUnknownIsNotAckable: a batch stopped after COMMIT (the
// process died before acking) reports ErrOutcomeUnknown; the redelivery finds
// the rows and applies nothing twice.
func TestCommitOutcomeUnknownIsNotAckable(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	p := newLedgerProcessor(t, pool)
	fp := failpoint.New()
	fp.Enable(failpoint.AfterCommit, 1)
	fp.Attach(p)
	ctx := context.Background()
	batch := []inbox.Message{intent("a", 1, 1), intent("b", 2, 2)}
	out, err := p.Process(ctx, batch)
	if !errors.Is(err, inbox.ErrOutcomeUnknown) || out[0].Ackable() || out[1].Ackable() {
		t.Fatalf("after-commit crash: %s, %v", statuses(out), err)
	}
	out, err = p.Process(ctx, batch)
	if err != nil || statuses(out) != "duplicate,duplicate" {
		t.Fatalf("redelivery: %s, %v", statuses(out), err)
	}
	assertClean(t, pool, map[string]inbox.Message{"a": batch[0], "b": batch[1]})
}

// scenario is how the guarantee scenario builds its processor: by default on
// the pool with the ledger; a mutation swaps in a broken part.
type scenario struct {
	db      func(pool *pgxpool.Pool) inbox.Beginner
	handler func(pool *pgxpool.Pool) inbox.Handler
	setup   func(p *inbox.Processor)
	// next is told each batch before it is processed.
	next func(batch []inbox.Message)
}

// runGuaranteeScenario replays a crash before commit, a redelivery after
// commit and a batch with duplicates, then returns the broken invariants.
// With n below the copy threshold the batches are claimed with ClaimTx;
// from it, with COPY, and the duplicate batch falls back to ClaimTx.
func runGuaranteeScenario(t *testing.T, n int, sc scenario) []string {
	pool := newDB(t)
	var db inbox.Beginner = pool
	if sc.db != nil {
		db = sc.db(pool)
	}
	var h inbox.Handler = effects.NewLedger()
	if sc.handler != nil {
		h = sc.handler(pool)
	}
	p, err := inbox.NewProcessor(db, inbox.Config{Scope: "ledger", Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	if sc.setup != nil {
		sc.setup(p)
	}
	fp := failpoint.New()
	fp.Enable(failpoint.BeforeCommit, 1)
	fp.Attach(p)
	ctx := context.Background()
	batch := make([]inbox.Message, n)
	want := make(map[string]inbox.Message, n)
	for i := range batch {
		id := fmt.Sprintf("m%04d", i)
		batch[i] = intent(id, int64(1+i%7), int64(10+i))
		want[id] = batch[i]
	}
	rev := slices.Clone(batch)
	slices.Reverse(rev)
	for _, b := range [][]inbox.Message{
		batch, // crashes before commit
		batch, // redelivery
		rev,   // duplicate delivery
	} {
		if sc.next != nil {
			sc.next(b)
		}
		_, _ = p.Process(ctx, b)
	}
	if copies := p.Stats().CopyClaims; (n >= inbox.CopyClaimThreshold) != (copies > 0) {
		t.Errorf("%d messages a batch: %d batches claimed with COPY", n, copies)
	}
	return ledgerViolations(t, pool, want)
}

// guaranteeSizes are the batch sizes the guarantee scenario runs with: one
// claimed with ClaimTx, one with COPY.
var guaranteeSizes = []int{2, 2 * inbox.CopyClaimThreshold}

func TestGuaranteeScenarioClean(t *testing.T) {
	for _, n := range guaranteeSizes {
		t.Run(fmt.Sprintf("batch=%d", n), func(t *testing.T) {
			if v := runGuaranteeScenario(t, n, scenario{}); len(v) > 0 {
				t.Fatalf("violations: %v", v)
			}
		})
	}
}

// outsideTx is the bug "effect outside the inbox transaction": a handler
// that applies the effect in a transaction of its own and commits it.
type outsideTx struct {
	db    inbox.Beginner
	inner inbox.Handler
}

func (h outsideTx) Handle(ctx context.Context, _ pgx.Tx, msgs []inbox.Message, errs []error) error {
	tx, err := h.db.Begin(ctx)
	if err != nil {
		return err
	}
	if err := h.inner.Handle(ctx, tx, msgs, errs); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}

// effectsFirst is the bug "effect before claim": a Beginner that applies
// the effects of the batch about to be processed as soon as the
// transaction begins, before the claim has looked at the inbox.
type effectsFirst struct {
	db    inbox.Beginner
	inner inbox.Handler
	batch []inbox.Message
}

func (b *effectsFirst) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := b.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := b.inner.Handle(ctx, tx, b.batch, make([]error, len(b.batch))); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// TestMutationsAreCaught breaks the processor on purpose, each time with a
// broken part of its own, and checks that the guarantee scenario turns red.
func TestMutationsAreCaught(t *testing.T) {
	t.Parallel()
	first := &effectsFirst{inner: effects.NewLedger()}
	for _, m := range []struct {
		name  string
		sizes []int
		sc    scenario
	}{
		{"effect-before-claim", guaranteeSizes, scenario{
			db:   func(pool *pgxpool.Pool) inbox.Beginner { first.db = pool; return first },
			next: func(b []inbox.Message) { first.batch = b },
		}},
		{"effect-outside-tx", guaranteeSizes, scenario{
			handler: func(pool *pgxpool.Pool) inbox.Handler { return outsideTx{db: pool, inner: effects.NewLedger()} },
		}},
		{"blind-copy-claim", guaranteeSizes[1:], scenario{setup: inbox.PlantBlindCopyClaim}}, // only big batches are copied
	} {
		for _, n := range m.sizes {
			t.Run(fmt.Sprintf("%s/batch=%d", m.name, n), func(t *testing.T) {
				v := runGuaranteeScenario(t, n, m.sc)
				if len(v) == 0 {
					t.Fatalf("mutation %s went unnoticed: the guarantee test cannot fail", m.name)
				}
				t.Logf("mutation %s caught: %d violations, first %s", m.name, len(v), v[0])
			})
		}
	}
}

func TestPrune(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	p := newLedgerProcessor(t, pool)
	var batch []inbox.Message
	for i := range 25 {
		batch = append(batch, intent("m"+string(rune('a'+i)), 1, 1))
	}
	if _, err := p.Process(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE inbox SET received_at = now() - interval '10 days' WHERE message_id < 'mq'`); err != nil {
		t.Fatal(err)
	}
	opts := inbox.PruneOptions{OlderThan: 24 * time.Hour, ReplayHorizon: 7 * 24 * time.Hour, BatchSize: 4}
	if _, err := inbox.Prune(ctx, pool, opts); !errors.Is(err, inbox.ErrUnsafeHorizon) {
		t.Fatalf("unsafe horizon: %v, want ErrUnsafeHorizon", err)
	}
	if _, err := inbox.Prune(ctx, pool, inbox.PruneOptions{OlderThan: time.Hour}); err == nil {
		t.Fatal("prune without ReplayHorizon succeeded")
	}
	opts.OlderThan = 8 * 24 * time.Hour
	n, err := inbox.Prune(ctx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if n != 16 || left != 9 {
		t.Fatalf("pruned %d (want 16), left %d (want 9)", n, left)
	}
}

func TestMigrateIdempotent(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	n, err := inbox.Migrate(context.Background(), pool)
	if err != nil || n != 0 {
		t.Fatalf("second Migrate applied %d, %v", n, err)
	}
	if sql := inbox.MigrationSQL(); !strings.Contains(sql, "CREATE TABLE inbox") {
		t.Fatalf("MigrationSQL: %q", sql)
	}
}

func TestCheckSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bare, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if err := inbox.CheckSchema(ctx, bare); !errors.Is(err, inbox.ErrNotMigrated) {
		t.Fatalf("unmigrated database: %v, want ErrNotMigrated", err)
	}
	if err := inbox.CheckSchema(ctx, newDB(t)); err != nil {
		t.Fatalf("migrated database: %v", err)
	}
}

// TestCommitCut cuts the connection while COMMIT is on the wire, once so
// that the server rolls back and once so that it commits. The processor
// reports ErrOutcomeUnknown both times (never ackable), and the redelivery
// settles it: applied exactly once either way.
func TestCommitCut(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		mode      faultconn.Mode
		committed bool
	}{
		{"rolled-back", faultconn.DropCommit, false},
		{"committed", faultconn.CutAfterCommit, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			plain := newDB(t)
			cfg := plain.Config()
			inj := &faultconn.Injector{}
			cfg.ConnConfig.AfterNetConnect = inj.AfterNetConnect
			faulty, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer faulty.Close()
			p := newLedgerProcessor(t, faulty)
			batch := []inbox.Message{intent("cut-1", 1, 40), intent("cut-2", 2, 2)}

			inj.Arm(tc.mode)
			out, err := p.Process(ctx, batch)
			if !errors.Is(err, inbox.ErrOutcomeUnknown) || out[0].Ackable() || out[1].Ackable() || inj.Fired() != 1 {
				t.Fatalf("cut commit: %s, %v (fired %d), want ErrOutcomeUnknown and nothing ackable", statuses(out), err, inj.Fired())
			}
			var rows int
			if err := plain.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if committed := rows == 2; committed != tc.committed {
				t.Fatalf("after the cut the server holds %d inbox rows; want committed=%v", rows, tc.committed)
			}
			want := "applied,applied"
			if tc.committed {
				want = "duplicate,duplicate"
			}
			if out, err := p.Process(ctx, batch); err != nil || statuses(out) != want {
				t.Fatalf("redelivery: %s, %v, want %s", statuses(out), err, want)
			}
			assertClean(t, plain, map[string]inbox.Message{"cut-1": batch[0], "cut-2": batch[1]})
		})
	}
}
