package pginbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestCancelledSyncWaitsThroughFailover: on a primary with a synchronous
// standby (pg_auto_failover), the standby's WAL receiver stalls, the
// commits waiting for it are cancelled with pg_cancel_backend (and
// answered with success and a warning), the primary dies with the WAL on
// the wire and the standby is promoted. Nothing a processor on a watched
// pool acknowledged, fresh or duplicate, is missing on the new primary.
// Beside it a processor on a pool made without WatchCommits acks on the
// warning, and its acknowledged intents are lost: what the watch is for.
func TestCancelledSyncWaitsThroughFailover(t *testing.T) {
	f := testenv.NewAutoFailover(t, testenv.AutoFailoverOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const db = "syncfail"
	url, err := f.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	watched, err := pginbox.NewPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer watched.Close()
	if _, err := pginbox.New(watched).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := effects.Migrate(ctx, watched); err != nil {
		t.Fatal(err)
	}
	if err := effects.SeedAccounts(ctx, watched, accounts); err != nil {
		t.Fatal(err)
	}
	plain, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	safe := newLedgerProcessor(t, watched)
	unsafe := newLedgerProcessor(t, plain)
	// Both pools connected before the stall.
	for _, pool := range []*pgxpool.Pool{watched, plain} {
		if err := pool.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}

	p, err := f.WaitPrimary(ctx, 2*time.Minute)
	if err != nil || p < 0 {
		t.Fatalf("primary %d: %v", p, err)
	}
	release, err := f.PauseWALReceiver(ctx, 1-p)
	if err != nil {
		t.Fatal(err)
	}
	canceller, err := testenv.StartSyncRepCanceller(ctx, f.NodeURL(p, "postgres"), 150*time.Millisecond)
	if err != nil {
		release(false)
		t.Fatal(err)
	}
	acked := map[string][]string{} // per processor, the IDs it may ack
	run := func(name string, proc *inbox.Processor[pgx.Tx], batch int, deliveries uint64) {
		msgs := make([]inbox.Message, 5)
		for i := range msgs {
			msgs[i] = intent(fmt.Sprintf("%s-%d-%d", name, batch, i), int64(batch*5+i+1), 1)
			msgs[i].Deliveries = deliveries
		}
		out, _ := proc.Process(ctx, msgs)
		for i, o := range out {
			if o.Ackable() {
				acked[name] = append(acked[name], msgs[i].ID)
			}
		}
	}
	for b := range 6 {
		run("safe", safe, b, 1)
		run("safe", safe, b, 2) // the redelivery: duplicates of a commit the standby lacks
		run("unsafe", unsafe, b, 1)
	}
	cancelled, err := canceller.Stop()
	if err != nil {
		t.Fatal(err)
	}
	f.KillNode(p)
	release(true) // the WAL on the wire to the standby dies with the primary
	for {
		if q, err := f.Primary(ctx); err == nil && q == 1-p {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s not promoted: %v", f.Name(1-p), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	c, err := pgx.Connect(ctx, f.NodeURL(1-p, db))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	lost := map[string]int{}
	for name, ids := range acked {
		var have int
		if err := c.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM ledger_entries WHERE message_id = ANY($1)`, ids).Scan(&have); err != nil {
			t.Fatal(err)
		}
		lost[name] = len(ids) - have
	}
	t.Logf("%d commits cancelled; acknowledged: safe %d, unsafe %d; lost after the failover: safe %d, unsafe %d",
		cancelled, len(acked["safe"]), len(acked["unsafe"]), lost["safe"], lost["unsafe"])
	if cancelled == 0 {
		t.Fatal("no wait for the standby was cancelled: the test did not stall it")
	}
	if lost["safe"] != 0 {
		t.Errorf("%d acknowledged intents lost through the failover", lost["safe"])
	}
	if lost["unsafe"] == 0 {
		t.Errorf("the pool without the watch lost nothing: the test no longer meets a commit the standby lacks")
	}

	// The redeliveries reach the promoted standby: every message the
	// watched pool left unacknowledged is applied there once and acked.
	after, err := pginbox.NewPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	again := newLedgerProcessor(t, after)
	for b := range 6 {
		msgs := make([]inbox.Message, 5)
		for i := range msgs {
			msgs[i] = intent(fmt.Sprintf("safe-%d-%d", b, i), int64(b*5+i+1), 1)
			msgs[i].Deliveries = 3
		}
		out, err := again.Process(ctx, msgs)
		if err != nil {
			t.Fatalf("redelivery after the failover: %v", err)
		}
		for i, o := range out {
			if !o.Ackable() {
				t.Fatalf("redelivery after the failover: %s not ackable: %v", msgs[i].ID, o.Status)
			}
		}
	}
	var entries, distinct int
	if err := c.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM ledger_entries WHERE message_id LIKE 'safe-%'`).Scan(&entries, &distinct); err != nil {
		t.Fatal(err)
	}
	if entries != 30 || distinct != 30 {
		t.Errorf("after the failover: %d ledger entries for %d of the 30 messages, want each once", entries, distinct)
	}
}
