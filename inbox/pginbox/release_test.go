package pginbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
)

var claimerSeq atomic.Int64

// claimerPool returns a pool on pool's database as a new role with what a
// claiming role gets in deploy/postgres/grants.sql and nothing more: no
// DELETE on inbox, no UPDATE of received_at, only inbox_release to give a
// claim back.
func claimerPool(t *testing.T, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	role := fmt.Sprintf("claimer_%d_%d", claimerSeq.Add(1), pool.Config().ConnConfig.Port)
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT ON inbox, accounts, jetinbox_migrations TO ` + role,
		`GRANT INSERT (scope, message_id, fingerprint, stream_seq, subject) ON inbox TO ` + role,
		`GRANT UPDATE (status, reason) ON inbox TO ` + role,
		`GRANT INSERT (scope, message_id, fingerprint, stream_seq, subject) ON inbox_conflicts TO ` + role,
		`GRANT UPDATE (balance) ON accounts TO ` + role,
		`GRANT INSERT (scope, message_id, account, amount) ON ledger_entries TO ` + role,
		`GRANT EXECUTE ON FUNCTION inbox_release(text, text[]) TO ` + role,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		// The role is cluster-wide; its grants go with the database.
		_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
	})
	cfg := pool.Config().Copy()
	cfg.ConnConfig.User = role
	cp, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	return cp
}

// transientThenLedger reports a passing error for the IDs in retry and
// applies the ledger to the others. With failBatch, a call with more than
// one message fails as a whole first, so that the processor isolates the
// batch: claims and effects then run under savepoints.
type transientThenLedger struct {
	retry     map[string]bool
	failBatch bool
}

func (h transientThenLedger) Handle(ctx context.Context, tx pgx.Tx, msgs []inbox.Message, errs []error) error {
	if h.failBatch && len(msgs) > 1 {
		return errors.New("the batch as a whole fails")
	}
	var rest []inbox.Message
	var at []int
	for i := range msgs {
		if h.retry[msgs[i].ID] {
			errs[i] = errors.New("downstream busy, try later")
			continue
		}
		rest = append(rest, msgs[i])
		at = append(at, i)
	}
	if len(rest) == 0 {
		return nil
	}
	sub := make([]error, len(rest))
	if err := effects.NewLedger().Handle(ctx, tx, rest, sub); err != nil {
		return err
	}
	for k, i := range at {
		errs[i] = sub[k]
	}
	return nil
}

// TestRetryReleasesClaimWithoutDelete: a role that may not DELETE from
// inbox (the shipped consumer role) still releases the claims of messages
// whose effect failed for a passing reason, in one-statement batches, COPY
// batches and isolated batches (claims under savepoints), and the
// redelivery applies them; inbox_release never removes a committed row.
func TestRetryReleasesClaimWithoutDelete(t *testing.T) {
	t.Parallel()
	owner := newDB(t)
	ctx := context.Background()
	claimer := claimerPool(t, owner)

	if _, err := claimer.Exec(ctx, `DELETE FROM inbox`); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("the claiming role may DELETE from inbox: %v", err)
	}
	if _, err := claimer.Exec(ctx, `UPDATE inbox SET received_at = now()`); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("the claiming role may rewrite received_at: %v", err)
	}

	for _, tc := range []struct {
		name      string
		n         int // messages in the batch; from 64 on, claimed with COPY
		failBatch bool
	}{
		{"one statement", 5, false},
		{"copy", 2 * pginbox.CopyClaimThreshold, false},
		{"isolated", 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := strings.ReplaceAll(tc.name, " ", "-")
			var batch []inbox.Message
			for i := range tc.n {
				batch = append(batch, intent(fmt.Sprintf("%s-%d", prefix, i), 1, 1))
			}
			retry := map[string]bool{batch[1].ID: true, batch[tc.n-1].ID: true}
			p, err := inbox.NewProcessor(pginbox.New(claimer), transientThenLedger{retry: retry, failBatch: tc.failBatch}, inbox.Config{Scope: "ledger"})
			if err != nil {
				t.Fatal(err)
			}
			out, err := p.Process(ctx, batch)
			if err != nil {
				t.Fatalf("batch under the claiming role: %v", err)
			}
			for i, o := range out {
				want := inbox.StatusApplied
				if retry[batch[i].ID] {
					want = inbox.StatusRetry
				}
				if o.Status != want {
					t.Fatalf("%s: %v (%s), want %v", batch[i].ID, o.Status, o.Reason, want)
				}
			}
			var rows int
			if err := owner.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE message_id LIKE $1`, prefix+"-%").Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != tc.n-len(retry) {
				t.Fatalf("%d inbox rows, want %d: the retried claims were not released", rows, tc.n-len(retry))
			}
			// The redelivery claims them afresh and applies them.
			again, err := inbox.NewProcessor(pginbox.New(claimer), effects.NewLedger(), inbox.Config{Scope: "ledger"})
			if err != nil {
				t.Fatal(err)
			}
			redelivered := []inbox.Message{batch[1], batch[tc.n-1]}
			out, err = again.Process(ctx, redelivered)
			if err != nil || statuses(out) != "applied,applied" {
				t.Fatalf("redelivery of the retried messages: %s, %v", statuses(out), err)
			}
		})
	}

	// inbox_release gives back only what the calling transaction inserted:
	// a committed row stays, whoever asks.
	tx, err := claimer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit a no-op
	if _, err := tx.Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint) VALUES ('ledger', 'mine', '\x01')`); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT inbox_release('ledger', ARRAY['mine', 'one-statement-0', 'copy-0', 'isolated-0'])`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("inbox_release removed %d rows, want 1 (the transaction's own)", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE message_id IN ('mine', 'one-statement-0', 'copy-0', 'isolated-0')`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 3 {
		t.Fatalf("%d of the 3 committed rows are left after inbox_release", left)
	}
	// Not even a committed row that carries the caller's start time.
	tx, err = claimer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back on purpose
	if _, err := tx.Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint) VALUES ('ledger', 'mine-2', '\x01')`); err != nil {
		t.Fatal(err)
	}
	var started any
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `UPDATE inbox SET received_at = $1 WHERE message_id = 'copy-0'`, started); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT inbox_release('ledger', ARRAY['copy-0', 'mine-2'])`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("inbox_release of its own row and a committed row stamped with its start time: removed %d (want 1), %v", n, err)
	}
}

// TestReleaseRefusesRowsOthersClaimed: a consumer session that rewrites
// another transaction's committed row (UPDATE of status or reason makes it
// the row's writer) cannot release it, even when its transaction began in
// the very microsecond the row was claimed. The collision is staged: the
// owner stamps the committed row with the attacking transaction's start
// time before the attacker touches it.
func TestReleaseRefusesRowsOthersClaimed(t *testing.T) {
	t.Parallel()
	owner := newDB(t)
	ctx := context.Background()
	claimer := claimerPool(t, owner)

	p := newLedgerProcessor(t, claimer)
	if out, err := p.Process(ctx, []inbox.Message{intent("victim", 1, 7)}); err != nil || statuses(out) != "applied" {
		t.Fatalf("claiming the victim: %s, %v", statuses(out), err)
	}

	tx, err := claimer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit a no-op
	var started any
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `UPDATE inbox SET received_at = $1 WHERE message_id = 'victim'`, started); err != nil {
		t.Fatal(err)
	}
	// What the consumer role may do to any row: rewrite status and reason.
	if _, err := tx.Exec(ctx, `UPDATE inbox SET reason = reason WHERE scope = 'ledger' AND message_id = 'victim'`); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT inbox_release('ledger', ARRAY['victim'])`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("inbox_release removed %d committed rows another transaction claimed", n)
	}
	// The redelivery is a duplicate, not applied a second time.
	out, err := p.Process(ctx, []inbox.Message{intent("victim", 1, 7)})
	if err != nil || statuses(out) != "duplicate" {
		t.Errorf("redelivery of the victim: %s, %v; want duplicate", statuses(out), err)
	}
	var entries int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE message_id = 'victim'`).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if entries != 1 {
		t.Errorf("%d ledger entries for the victim, want 1", entries)
	}
}
