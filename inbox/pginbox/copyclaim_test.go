package pginbox_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// copyScenario is a run of big batches that meets every case the copy claim
// must hand back to ClaimTx: IDs already applied, an ID reused with another
// payload, an ID rejected before, and a batch with the same ID twice.
func copyScenario() [][]inbox.Message {
	mk := func(prefix string, from, to int) []inbox.Message {
		var b []inbox.Message
		for i := from; i < to; i++ {
			b = append(b, intent(fmt.Sprintf("%s%04d", prefix, i), int64(1+i%5), int64(i)))
		}
		return b
	}
	fresh := mk("a", 0, 100)
	overlap := mk("b", 0, 80)
	overlap = append(overlap, fresh[10:30]...)
	reused := intent("a0050", 1, 999_999) // same ID as fresh[50], other payload
	overlap = append(overlap, reused)
	bad := inbox.Message{ID: "bad0", Payload: []byte(`{"account":1}`), Deliveries: 1}
	withBad := append(mk("c", 0, 80), bad)
	again := append(mk("d", 0, 70), bad) // a rejected ID delivered again
	twice := mk("e", 0, 80)
	twice = append(twice, twice[3])
	return [][]inbox.Message{fresh, overlap, withBad, again, twice, mk("f", 0, 100)}
}

// runCopyScenario runs the scenario with a new processor per batch (so every
// batch tries COPY first) and returns each batch's statuses and the rows.
func runCopyScenario(t *testing.T, pool *pgxpool.Pool, copyClaim bool) (got []string, stats inbox.ProcessorStats) {
	t.Helper()
	ctx := context.Background()
	for i, batch := range copyScenario() {
		st := pginbox.New(pool)
		if !copyClaim {
			pginbox.DisableCopyClaim(st)
		}
		p, err := inbox.NewProcessor(st, effects.NewLedger(), inbox.Config{Scope: "ledger"})
		if err != nil {
			t.Fatal(err)
		}
		out, err := p.Process(ctx, batch)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		stats.CopyClaims += p.Stats().CopyClaims
		stats.CopyFallbacks += p.Stats().CopyFallbacks
		for j, o := range out {
			got = append(got, fmt.Sprintf("%d %s %v %v %s", i, batch[j].ID, o.Status, o.AlreadyInInbox, o.Reason))
		}
	}
	rows, err := pool.Query(ctx, `SELECT message_id || ' ' || status || ' ' || coalesce(reason, '') FROM inbox ORDER BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	var bal string
	if err := pool.QueryRow(ctx, `SELECT string_agg(id || '=' || balance, ',' ORDER BY id) FROM accounts WHERE balance <> 0`).Scan(&bal); err != nil {
		t.Fatal(err)
	}
	return append(got, bal), stats
}

// TestCopyClaimSameOutcomesAsClaimTx runs the same batches with the copy
// claim on (the default) and off, and requires identical outcomes, inbox
// rows and balances: COPY is an optimisation, never a different answer.
func TestCopyClaimSameOutcomesAsClaimTx(t *testing.T) {
	fast, fs := runCopyScenario(t, newDB(t), true)
	slow, ss := runCopyScenario(t, newDB(t), false)
	// fresh, withBad and the last batch copy; overlap and again fall
	// back; twice (an ID twice) never tries.
	if fs.CopyClaims != 3 || fs.CopyFallbacks != 2 || ss != (inbox.ProcessorStats{}) {
		t.Fatalf("claims: %+v with the fast path, %+v without; the test does not compare the two paths", fs, ss)
	}
	if !slices.Equal(fast, slow) {
		for i := range max(len(fast), len(slow)) {
			var f, s string
			if i < len(fast) {
				f = fast[i]
			}
			if i < len(slow) {
				s = slow[i]
			}
			if f != s {
				t.Errorf("line %d:\n copy:     %.300s\n claimtx:  %.300s", i, f, s)
			}
		}
	}
	all := strings.Join(fast, "\n")
	for _, want := range []string{"1 a0050 conflict true", "1 a0010 duplicate true", "2 bad0 rejected false", "3 bad0 rejected true", "4 e0003 duplicate false"} {
		if !strings.Contains(all, want) {
			t.Errorf("scenario did not reach %q", want)
		}
	}
}

// TestCopyClaimRaces has four processors claim the same 400 first
// deliveries at once, in overlapping batches cut at different places: the
// copy claims wait on each other's keys, fall back, and every message is
// applied exactly once.
func TestCopyClaimRaces(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	const n, workers, size = 400, 4, 100
	msgs := make([]inbox.Message, n)
	want := map[string]inbox.Message{}
	for i := range msgs {
		msgs[i] = intent(fmt.Sprintf("r%04d", i), int64(1+i%accounts), int64(1+i%9))
		want[msgs[i].ID] = msgs[i]
	}
	applied := make([][]int, workers) // per worker, per message: times applied
	var copies int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range workers {
		applied[w] = make([]int, n)
		p := newLedgerProcessor(t, pool)
		wg.Go(func() {
			start := w * 37
			for k := 0; k < n; k += size {
				var batch []int
				for j := range size {
					batch = append(batch, (start+k+j)%n)
				}
				in := make([]inbox.Message, len(batch))
				for j, i := range batch {
					in[j] = msgs[i]
				}
				out, err := p.Process(context.Background(), in)
				if err != nil {
					t.Error(err)
					return
				}
				for j, o := range out {
					if o.Status == inbox.StatusApplied {
						applied[w][batch[j]]++
					} else if o.Status != inbox.StatusDuplicate {
						t.Errorf("%s: %v", in[j].ID, o)
					}
				}
			}
			mu.Lock()
			copies += p.Stats().CopyClaims
			mu.Unlock()
		})
	}
	wg.Wait()
	for i := range n {
		total := 0
		for w := range workers {
			total += applied[w][i]
		}
		if total != 1 {
			t.Errorf("%s applied %d times", msgs[i].ID, total)
		}
	}
	if copies == 0 {
		t.Error("no batch was claimed with COPY")
	}
	assertClean(t, pool, want)
}

// TestWarmOpensConnections: Warm leaves n connections open in the pool, each
// with the claim and ledger statements prepared, and nothing written.
func TestWarmOpensConnections(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	p := newLedgerProcessor(t, pool)
	ctx := context.Background()
	if err := p.Warm(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if n := pool.Stat().TotalConns(); n < 3 {
		t.Fatalf("%d connections open after Warm(3)", n)
	}
	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for _, c := range conns {
		var claim, ledger int
		if err := c.QueryRow(ctx, `SELECT count(*) FILTER (WHERE statement LIKE '%INSERT INTO inbox%'),
	count(*) FILTER (WHERE statement LIKE '%UPDATE accounts%')
FROM pg_prepared_statements WHERE statement NOT LIKE '%pg_prepared_statements%'`).Scan(&claim, &ledger); err != nil {
			t.Fatal(err)
		}
		if claim != 1 || ledger != 2 { // the claim; the ledger's large and small updates
			t.Errorf("connection has %d claim and %d ledger statements prepared", claim, ledger)
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("inbox rows after Warm: %d, %v", rows, err)
	}
}

// TestWarmSmallPool: asking for more connections than the pool has is
// capped, not a ten-second wait.
func TestWarmSmallPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pginbox.WatchCommits(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pginbox.New(pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := effects.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	p := newLedgerProcessor(t, pool)
	start := time.Now()
	if err := p.Warm(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Warm(5) on a pool of 2 took %v", d)
	}
}
