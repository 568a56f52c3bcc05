package pginbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/faultconn"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func claimOne(t *testing.T, pool *pgxpool.Pool, scope string, c driver.Claim) driver.ClaimResult {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := pginbox.ClaimTx(ctx, tx, scope, []driver.Claim{c})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return res[0]
}

func TestClaimBatchOneStatement(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	claimOne(t, pool, "s", driver.Claim{ID: "old", Fingerprint: inbox.Fingerprint([]byte("x"))})
	claims := []driver.Claim{
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
	res, err := pginbox.ClaimTx(ctx, tx, "s", claims)
	if err != nil {
		t.Fatal(err)
	}
	want := []driver.ClaimState{driver.ClaimFresh, driver.ClaimDuplicate, driver.ClaimDuplicate, driver.ClaimConflict, driver.ClaimConflict, driver.ClaimFresh}
	for i := range want {
		if res[i].State != want[i] {
			t.Errorf("claim %d (%s): %v, want %v", i, claims[i].ID, res[i].State, want[i])
		}
	}
	if _, err := pginbox.ClaimTx(ctx, tx, "s", []driver.Claim{{ID: "bad id"}}); !errors.Is(err, inbox.ErrInvalidID) {
		t.Fatalf("claim with a space in the ID: %v, want ErrInvalidID", err)
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
			c := driver.Claim{ID: "same", Fingerprint: inbox.Fingerprint([]byte("p"))}
			tx1, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if r, err := pginbox.ClaimTx(ctx, tx1, "s", []driver.Claim{c}); err != nil || r[0].State != driver.ClaimFresh {
				t.Fatalf("first claim: %v %v", r, err)
			}
			var pid1 uint32
			if err := tx1.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid1); err != nil {
				t.Fatal(err)
			}
			got := make(chan driver.ClaimState, 1)
			go func() {
				tx2, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					got <- 0
					return
				}
				defer tx2.Rollback(ctx)
				r, err := pginbox.ClaimTx(ctx, tx2, "s", []driver.Claim{c})
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
			want := driver.ClaimDuplicate
			if commit {
				err = tx1.Commit(ctx)
			} else {
				err, want = tx1.Rollback(ctx), driver.ClaimFresh
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

func TestCheckSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bare, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if err := pginbox.New(bare).CheckSchema(ctx); !errors.Is(err, inbox.ErrNotMigrated) {
		t.Fatalf("unmigrated database: %v, want ErrNotMigrated", err)
	}
	if err := pginbox.New(newDB(t)).CheckSchema(ctx); err != nil {
		t.Fatalf("migrated database: %v", err)
	}
	if sql := pginbox.New(nil).MigrationSQL(); !strings.Contains(sql, "CREATE TABLE inbox") {
		t.Fatalf("MigrationSQL: %q", sql)
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
