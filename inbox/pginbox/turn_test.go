package pginbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
)

// TestEffectDoesNotWaitForTheCommitBefore: the effect's turn
// (EffectConcurrency 1) ends where a batch's COMMIT starts, so the next
// batch's effect, on rows the first did not touch, runs while that COMMIT
// is still under way. Here the first batch's COMMIT takes two seconds (a
// deferred trigger sleeps in it); the second batch's effect must be done
// before that COMMIT is. Held to COMMIT, the turn would make it wait.
func TestEffectDoesNotWaitForTheCommitBefore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newDB(t)
	for _, q := range []string{
		`CREATE TABLE slow_commit (id text PRIMARY KEY)`,
		`CREATE FUNCTION slow_commit_sleep() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow_commit_at_commit AFTER INSERT ON slow_commit
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit_sleep()`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if m.ID == "slow" {
			_, err := tx.Exec(ctx, `INSERT INTO slow_commit VALUES ($1)`, m.ID)
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = 1`)
		return err
	})
	p, err := inbox.NewProcessor(pginbox.New(pool), h, inbox.Config{Scope: "turn"})
	if err != nil {
		t.Fatal(err)
	}
	var slow, next inbox.StepTimes
	slowDone := make(chan error, 1)
	go func() {
		out, err := p.Process(inbox.WithStepTimes(ctx, &slow), []inbox.Message{{ID: "slow", Payload: []byte("{}"), Deliveries: 1}})
		if err == nil && out[0].Status != inbox.StatusApplied {
			err = out[0].Err
		}
		slowDone <- err
	}()
	// The first batch is in its COMMIT once its trigger sleeps.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first batch never reached its COMMIT")
		}
		time.Sleep(5 * time.Millisecond)
	}
	out, err := p.Process(inbox.WithStepTimes(ctx, &next), []inbox.Message{{ID: "next", Payload: []byte("{}"), Deliveries: 1}})
	if err != nil || out[0].Status != inbox.StatusApplied {
		t.Fatalf("the second batch: %v, %+v", err, out)
	}
	if err := <-slowDone; err != nil {
		t.Fatalf("the first batch: %v", err)
	}
	if !next.Applied.Before(slow.Committed) {
		t.Fatalf("the second batch's effect ended %v after the first batch's COMMIT: it waited for that COMMIT to take its turn",
			next.Applied.Sub(slow.Committed))
	}
	t.Logf("the second batch's effect ended %v before the first batch's COMMIT", slow.Committed.Sub(next.Applied))
}
