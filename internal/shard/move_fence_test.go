package shard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
)

// threeShards is a map of four partitions over a, b and c.
func threeShards() Map {
	return (&Map{Partitions: 4, Shards: []Shard{
		{Name: "a", DatabaseURL: "x", Partitions: Set{0, 1}},
		{Name: "b", DatabaseURL: "y", Partitions: Set{2}},
		{Name: "c", DatabaseURL: "z", Partitions: Set{3}},
	}}).WithDefaults()
}

// owners returns the shards whose databases say they own p.
func owners(t *testing.T, m *Map, pools map[string]*pgxpool.Pool, p int) []string {
	t.Helper()
	var out []string
	for _, s := range m.Shards {
		o, err := owns(context.Background(), pools[s.Name], m.Scope, p)
		if err != nil {
			t.Fatal(err)
		}
		if o {
			out = append(out, s.Name)
		}
	}
	return out
}

// holdBatch opens a batch of partition p in shard a's database, claimed and
// fenced, not committed: a move's fence waits for it.
func holdBatch(t *testing.T, m *Map, pool *pgxpool.Pool, p int) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	id := idOf(p, m.Partitions)
	msg := inbox.Message{ID: id, Payload: []byte("{}"), Subject: StoredSubject(m.Subject, id, "ledger.1", m.Partitions), StreamSeq: 1}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) }) //nolint:errcheck // after Commit, a no-op
	if _, err := pginbox.ClaimTx(ctx, tx, m.Scope, []driver.Claim{{ID: id, Fingerprint: inbox.Fingerprint(msg.Payload), Subject: msg.Subject, StreamSeq: 1}}); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 1)
	if err := (&Fenced{Map: m, Inner: &recorder{}}).Handle(ctx, tx, []inbox.Message{msg}, errs); err != nil || errs[0] != nil {
		t.Fatalf("the owner's batch: %v %v", err, errs[0])
	}
	return tx
}

// TestMoveConcurrentTargets runs two moves of one partition to two targets
// at once, while a batch of it is in flight in the source (both wait at
// the fence), and then a rerun to the other target while the first move is
// still copying: exactly one shard may own the partition at every end, and
// the refused moves name the target the source recorded.
func TestMoveConcurrentTargets(t *testing.T) {
	ctx := context.Background()
	m := threeShards()
	pools := newShardPools(t, &m)
	side := func(n string) Side { return Side{n, pools[n]} }

	// Two moves at once, to b and to c.
	batch := holdBatch(t, &m, pools["a"], 0)
	type result struct {
		to  string
		err error
	}
	done := make(chan result, 2)
	for _, to := range []string{"b", "c"} {
		go func() {
			_, err := Move(ctx, &m, 0, side("a"), side(to))
			done <- result{to, err}
		}()
	}
	time.Sleep(300 * time.Millisecond) // both wait at the fence
	if err := batch.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var won []string
	for range 2 {
		r := <-done
		switch {
		case r.err == nil:
			won = append(won, r.to)
		case !errors.Is(r.err, ErrOtherTarget):
			t.Errorf("the move to %s: %v, want a refusal naming the other target", r.to, r.err)
		default:
			t.Logf("the move to %s: %v", r.to, r.err)
		}
	}
	if len(won) != 1 {
		t.Errorf("moves to b and c at once: %v succeeded, want exactly one", won)
	}
	if o := owners(t, &m, pools, 0); len(o) != 1 || len(won) == 1 && o[0] != won[0] {
		t.Errorf("partition 0 owned by %v after two moves at once (the move to %v won)", o, won)
	}

	// A rerun to another target while the first move is still copying:
	// the target's taking of partition 1 is held up by a lock on its row.
	if _, err := pools["b"].Exec(ctx, `INSERT INTO jetinbox_partitions (scope, partition, owned) VALUES ($1, 1, false)`, m.Scope); err != nil {
		t.Fatal(err)
	}
	hold, err := pools["b"].Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx) //nolint:errcheck // test
	if _, err := hold.Exec(ctx, `SELECT 1 FROM jetinbox_partitions WHERE scope = $1 AND partition = 1 FOR UPDATE`, m.Scope); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() {
		_, err := Move(ctx, &m, 1, side("a"), side("b"))
		first <- err
	}()
	waitFencedAndTaking(t, pools, m.Scope, 1, "b")
	_, err = Move(ctx, &m, 1, side("a"), side("c"))
	if !errors.Is(err, ErrOtherTarget) || !strings.Contains(err.Error(), "--to b") {
		t.Errorf("a rerun to c while the move to b copies: %v, want a refusal naming b", err)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Errorf("the first move, to b: %v", err)
	}
	if o := owners(t, &m, pools, 1); len(o) != 1 || o[0] != "b" {
		t.Errorf("partition 1 owned by %v, want [b]", o)
	}
	// A rerun of a finished move to another target: the source gave it to
	// b, and c may not take it.
	if _, err := Move(ctx, &m, 1, side("a"), side("c")); !errors.Is(err, ErrOtherTarget) {
		t.Errorf("a rerun to c after the move to b: %v, want a refusal", err)
	}
	if o := owners(t, &m, pools, 1); len(o) != 1 {
		t.Errorf("partition 1 owned by %v, want one owner", o)
	}
}

// TestPartitionOfInSQL holds the database's partition function, which the
// move's copy filters by, to shard.PartitionOf.
func TestPartitionOfInSQL(t *testing.T) {
	ctx := context.Background()
	m := threeShards()
	pool := newShardPools(t, &m)["a"]
	var ids []string
	for i := range 400 {
		ids = append(ids, fmt.Sprintf("id-%d", i), fmt.Sprintf("order.%d with spaces/ü/日本/%s", i, strings.Repeat("x", i%200)))
	}
	for _, n := range []int{1, 4, 7, 64, 1024} {
		rows, err := pool.Query(ctx, `SELECT jetinbox_partition_of(id, $2) FROM unnest($1::text[]) WITH ORDINALITY AS t(id, i) ORDER BY i`, ids, n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if want := PartitionOf(id, n); got[i] != want {
				t.Fatalf("partition of %q among %d: the database says %d, PartitionOf %d", id, n, got[i], want)
			}
		}
	}
}

// TestMoveLargeInboxUnderStatementTimeout moves a partition out of an inbox
// of 50,000 rows with a statement timeout on every connection far shorter
// than one read of the whole inbox: the copy pages on the primary key,
// filters in the database, and lifts the timeout in its own transactions.
func TestMoveLargeInboxUnderStatementTimeout(t *testing.T) {
	ctx := context.Background()
	m := threeShards()
	pools := newShardPools(t, &m)
	const rows = 50000
	if _, err := pools["a"].Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint, status, stream_seq, subject, received_at)
SELECT $1, 'big-' || i, '\x01', 'applied', i, 'pintents.0.k.ledger.1', now() FROM generate_series(1, $2) AS i`, m.Scope, rows); err != nil {
		t.Fatal(err)
	}
	want := 0
	for i := 1; i <= rows; i++ {
		if PartitionOf(fmt.Sprintf("big-%d", i), m.Partitions) == 0 {
			want++
		}
	}
	// Every connection of the move under a short statement timeout, as the
	// server's setting would put it.
	timed := func(name string) Side {
		cfg := pools[name].Config().Copy()
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = "100ms"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return Side{name, pool}
	}
	began := time.Now()
	res, err := Move(ctx, &m, 0, timed("a"), timed("b"))
	if err != nil {
		t.Fatalf("the move: %v (owners now %v)", err, owners(t, &m, pools, 0))
	}
	t.Logf("moved %d of %d rows in %v", res.Copied, rows, time.Since(began))
	var n int
	if err := pools["b"].QueryRow(ctx, `SELECT count(*) FROM inbox WHERE scope = $1`, m.Scope).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != want || res.Copied != int64(want) {
		t.Errorf("the target has %d inbox rows (copied %d), want partition 0's %d", n, res.Copied, want)
	}
	if o := owners(t, &m, pools, 0); len(o) != 1 || o[0] != "b" {
		t.Errorf("partition 0 owned by %v, want [b]", o)
	}
}

// TestMoveBackAfterFailedCopy fails a move's copy after its fence (the
// target refuses inbox rows): the partition is owned by no shard. Moving
// it back to its source gives it back, and is refused once the target
// owns it.
func TestMoveBackAfterFailedCopy(t *testing.T) {
	ctx := context.Background()
	m := threeShards()
	pools := newShardPools(t, &m)
	side := func(n string) Side { return Side{n, pools[n]} }
	id := idOf(0, m.Partitions)
	if _, err := pools["a"].Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint, status, stream_seq, subject, received_at) VALUES ($1, $2, '\x01', 'applied', 1, 's', now())`, m.Scope, id); err != nil {
		t.Fatal(err)
	}
	if _, err := pools["b"].Exec(ctx, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'disk full'; END $$;
CREATE TRIGGER refuse BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	if _, err := Move(ctx, &m, 0, side("a"), side("b")); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("the move with a failing copy: %v", err)
	}
	if o := owners(t, &m, pools, 0); len(o) != 0 {
		t.Fatalf("partition 0 owned by %v after a failed copy, want none", o)
	}
	// Not to a third shard, and not back with the wrong recorded target.
	if _, err := Move(ctx, &m, 0, side("a"), side("c")); !errors.Is(err, ErrOtherTarget) {
		t.Errorf("resuming to c: %v, want a refusal", err)
	}
	if _, err := Unfence(ctx, &m, 0, side("a"), side("c")); err == nil {
		t.Error("giving back a partition a gave to b, checked against c: no error")
	}
	changed, err := Unfence(ctx, &m, 0, side("a"), side("b"))
	if err != nil || !changed {
		t.Fatalf("giving partition 0 back to a: %v %v", changed, err)
	}
	if o := owners(t, &m, pools, 0); len(o) != 1 || o[0] != "a" {
		t.Errorf("partition 0 owned by %v, want [a]", o)
	}
	// The move runs once the target takes rows; then a cannot take it back
	// by un-fencing.
	if _, err := pools["b"].Exec(ctx, `DROP TRIGGER refuse ON inbox`); err != nil {
		t.Fatal(err)
	}
	if res, err := Move(ctx, &m, 0, side("a"), side("b")); err != nil || res.Copied != 1 {
		t.Fatalf("the move again: %+v %v", res, err)
	}
	if _, err := pools["a"].Exec(ctx, `UPDATE jetinbox_partitions SET owned = false, moved_to = 'b' WHERE scope = $1 AND partition = 0`, m.Scope); err != nil {
		t.Fatal(err)
	}
	if _, err := Unfence(ctx, &m, 0, side("a"), side("b")); err == nil || !strings.Contains(err.Error(), "owns partition 0") {
		t.Errorf("giving back a partition b owns: %v, want a refusal", err)
	}
	if o := owners(t, &m, pools, 0); len(o) != 1 || o[0] != "b" {
		t.Errorf("partition 0 owned by %v, want [b]", o)
	}
}

// TestUnfenceWhileCopying gives a partition back to its source while the
// move to b is still copying it: the give-back waits for the copy's
// transaction, finds b owning it and is refused; one owner.
func TestUnfenceWhileCopying(t *testing.T) {
	ctx := context.Background()
	m := threeShards()
	pools := newShardPools(t, &m)
	side := func(n string) Side { return Side{n, pools[n]} }
	if _, err := pools["b"].Exec(ctx, `INSERT INTO jetinbox_partitions (scope, partition, owned) VALUES ($1, 0, false)`, m.Scope); err != nil {
		t.Fatal(err)
	}
	hold, err := pools["b"].Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx) //nolint:errcheck // test
	if _, err := hold.Exec(ctx, `SELECT 1 FROM jetinbox_partitions WHERE scope = $1 AND partition = 0 FOR UPDATE`, m.Scope); err != nil {
		t.Fatal(err)
	}
	moved := make(chan error, 1)
	go func() {
		_, err := Move(ctx, &m, 0, side("a"), side("b"))
		moved <- err
	}()
	waitFencedAndTaking(t, pools, m.Scope, 0, "b")
	unfenced := make(chan error, 1)
	go func() {
		_, err := Unfence(ctx, &m, 0, side("a"), side("b"))
		unfenced <- err
	}()
	var unfenceErr error
	waited := false
	select {
	case unfenceErr = <-unfenced:
		t.Errorf("the give-back did not wait for the copy in progress: %v", unfenceErr)
	case <-time.After(300 * time.Millisecond):
		waited = true
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-moved; err != nil {
		t.Errorf("the move: %v", err)
	}
	if waited {
		unfenceErr = <-unfenced
	}
	if unfenceErr == nil {
		t.Error("the give-back while b took the partition: no error")
	}
	if o := owners(t, &m, pools, 0); len(o) != 1 || o[0] != "b" {
		t.Errorf("partition 0 owned by %v, want [b]", o)
	}
}

// waitFencedAndTaking polls until the move of partition p to target is
// fenced on a (moved_to names target) and waits on the target's held row
// to take it: a loaded machine can take any fixed time to get there.
func waitFencedAndTaking(t *testing.T, pools map[string]*pgxpool.Pool, scope string, p int, target string) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var fenced bool
		var waiting int
		if err := pools["a"].QueryRow(ctx, `SELECT coalesce(moved_to = $3, false) FROM jetinbox_partitions WHERE scope = $1 AND partition = $2`, scope, p, target).Scan(&fenced); err != nil {
			t.Fatal(err)
		}
		if err := pools[target].QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if fenced && waiting > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the move of partition %d did not reach its wait for %s's row in 2 minutes (fenced %v, waiting %d)", p, target, fenced, waiting)
		}
	}
}

// TestStaleMoveRerunRefused: a move run again long after it finished,
// once its target moved the partition on, is refused (the target's row is
// newer than the source's), and so is giving the partition back to the
// first source: one owner. Without the epoch the re-run made the first
// target an owner beside the second.
func TestStaleMoveRerunRefused(t *testing.T) {
	ctx := context.Background()
	m := threeShards()
	pools := newShardPools(t, &m)
	side := func(n string) Side { return Side{n, pools[n]} }
	if _, err := Move(ctx, &m, 0, side("a"), side("b")); err != nil {
		t.Fatal(err)
	}
	if _, err := Move(ctx, &m, 0, side("b"), side("c")); err != nil {
		t.Fatal(err)
	}
	if _, err := Move(ctx, &m, 0, side("a"), side("b")); !errors.Is(err, ErrMoveFinished) {
		t.Errorf("the first move run again: %v, want ErrMoveFinished", err)
	}
	if _, err := Unfence(ctx, &m, 0, side("a"), side("b")); !errors.Is(err, ErrMoveFinished) {
		t.Errorf("giving it back to a: %v, want ErrMoveFinished", err)
	}
	if o := owners(t, &m, pools, 0); len(o) != 1 || o[0] != "c" {
		t.Errorf("partition 0 owned by %v, want [c]", o)
	}
	// Moves on from the owner still go through, back to a shard that had
	// it before too.
	if _, err := Move(ctx, &m, 0, side("c"), side("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := Move(ctx, &m, 0, side("a"), side("b")); err != nil {
		t.Fatal(err)
	}
	if o := owners(t, &m, pools, 0); len(o) != 1 || o[0] != "b" {
		t.Errorf("partition 0 owned by %v, want [b]", o)
	}
}
