package shard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestMoveStopsOnAFenceTheStandbyNeverConfirmed: the source waits for a
// synchronous standby that never answers, and its waiting COMMITs are
// cancelled, which PostgreSQL answers with success and a warning: the
// fence is then committed on the source's primary only, and a failover
// there would bring back a source that owns the partition. The move stops
// before the target takes it, and so does a rerun, whose fence changes no
// row yet must wait for the standby too.
func TestMoveStopsOnAFenceTheStandbyNeverConfirmed(t *testing.T) {
	ctx := context.Background()
	m := threeShards()
	pools := newShardPools(t, &m)

	srv := testenv.NewStandbyless(t)
	url, err := srv.CreateDatabase(ctx, "shard_a")
	if err != nil {
		t.Fatal(err)
	}
	src, err := pginbox.NewPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	if _, err := pginbox.New(src).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Migrate(ctx, src, &m, "a"); err != nil {
		t.Fatal(err)
	}
	pools["a"] = src
	if err := srv.SetSynchronousStandby(ctx, testenv.AbsentStandby); err != nil {
		t.Fatal(err)
	}
	canceller, err := testenv.StartSyncRepCanceller(ctx, url, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = canceller.Stop() })

	for _, run := range []string{"the move", "a rerun"} {
		_, err := Move(ctx, &m, 0, Side{"a", src}, Side{"b", pools["b"]})
		if !errors.Is(err, pginbox.ErrCommitNotReplicated) {
			t.Fatalf("%s: %v, want the fence's commit not replicated", run, err)
		}
		if got := owners(t, &m, pools, 0); len(got) != 0 {
			t.Fatalf("%s: partition 0 owned by %v; the target must not take it on a fence the standby lacks", run, got)
		}
	}
}
