package shard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) {
	// BenchmarkShardDelivery starts this binary again as a nats-server.
	subproc.Dispatch(map[string]func([]string) int{subproc.RoleNATSServer: subproc.NATSServer})
	testenv.MainNoLeaks(m)
}

// recorder is an effect that records which messages it applied.
type recorder struct{ applied []string }

func (r *recorder) Handle(_ context.Context, _ pgx.Tx, msgs []inbox.Message, _ []error) error {
	for _, m := range msgs {
		r.applied = append(r.applied, m.ID)
	}
	return nil
}

// TestMoveWaitsForBatchesInFlight holds a batch of the moved partition open
// in the source (claimed, fenced, not committed) while the move runs: the
// move must wait for it, copy its inbox row once it committed, and from
// then on the source must refuse the partition.
func TestMoveWaitsForBatchesInFlight(t *testing.T) {
	ctx := context.Background()
	m := (&Map{Partitions: 4, Shards: []Shard{{Name: "a", DatabaseURL: "x", Partitions: Set{0, 1}}, {Name: "b", DatabaseURL: "y", Partitions: Set{2, 3}}}}).WithDefaults()
	pools := newShardPools(t, &m)
	id := idOf(0, 4)
	msg := inbox.Message{ID: id, Payload: []byte("{}"), Subject: StoredSubject(m.Subject, id, "ledger.1", 4), StreamSeq: 1}
	rec := &recorder{}
	f := &Fenced{Map: &m, Inner: rec}

	// The batch in flight: its claim and fence taken, not committed.
	tx, err := pools["a"].Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the pool cannot close while it is open
	if _, err := pginbox.ClaimTx(ctx, tx, m.Scope, []driver.Claim{{ID: id, Fingerprint: inbox.Fingerprint(msg.Payload), Subject: msg.Subject, StreamSeq: 1}}); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 1)
	if err := f.Handle(ctx, tx, []inbox.Message{msg}, errs); err != nil || errs[0] != nil {
		t.Fatalf("the owner's batch: %v %v", err, errs[0])
	}
	done := make(chan error, 1)
	var res MoveResult
	go func() {
		var err error
		res, err = Move(ctx, &m, 0, Side{"a", pools["a"]}, Side{"b", pools["b"]})
		done <- err
	}()
	var moveErr error
	waited := false
	select {
	case moveErr = <-done:
		t.Errorf("the move did not wait for the batch in flight (err %v)", moveErr)
	case <-time.After(500 * time.Millisecond):
		waited = true
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if waited {
		moveErr = <-done
	}
	if moveErr != nil {
		t.Fatal(moveErr)
	}
	if res.Copied != 1 {
		t.Errorf("copied %d inbox rows, want the batch's 1", res.Copied)
	}
	var n int
	if err := pools["b"].QueryRow(ctx, `SELECT count(*) FROM inbox WHERE scope = $1 AND message_id = $2`, m.Scope, id).Scan(&n); err != nil || n != 1 {
		t.Errorf("target's inbox row of %s: %d (%v)", id, n, err)
	}
	// The source refuses the partition now, in the transaction.
	tx2, err := pools["a"].Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx) //nolint:errcheck // test
	errs[0] = nil
	if err := f.Handle(ctx, tx2, []inbox.Message{msg}, errs); err != nil || errs[0] == nil || inbox.IsPermanent(errs[0]) {
		t.Errorf("the source after the move: err %v, message error %v; want a retry", err, errs[0])
	}
	if len(rec.applied) != 1 {
		t.Errorf("applied %d times in the source", len(rec.applied))
	}
	for name, want := range map[string]Set{"a": {1}, "b": {0, 2, 3}} {
		if got, err := Owned(ctx, pools[name], m.Scope); err != nil || got.String() != want.String() {
			t.Errorf("shard %s owns %v (%v), want %v", name, got, err, want)
		}
	}
	// Run again, it finds the move done.
	if res, err := Move(ctx, &m, 0, Side{"a", pools["a"]}, Side{"b", pools["b"]}); err != nil || !res.Already {
		t.Errorf("a second move: %+v %v", res, err)
	}
}

// newShardPools migrates a database per shard of m and returns their pools
// by shard name.
func newShardPools(t *testing.T, m *Map) map[string]*pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pools := map[string]*pgxpool.Pool{}
	for _, s := range m.Shards {
		pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		if _, err := pginbox.New(pool).Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := Migrate(ctx, pool, m, s.Name); err != nil {
			t.Fatal(err)
		}
		pools[s.Name] = pool
	}
	return pools
}

// idOf returns an ID of partition p among n.
func idOf(p, n int) string {
	for i := 0; ; i++ {
		if c := fmt.Sprintf("id-%d", i); PartitionOf(c, n) == p {
			return c
		}
	}
}
