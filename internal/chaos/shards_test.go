package chaos

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/jetinbox/jetinbox/internal/cli"
)

// TestShardsSmoke is the CI-sized sharded run: three shards, each on its
// own PostgreSQL, one of them SIGKILLed and a partition moved while intents
// flow, strays after the duplicate window on every path that could reach
// another partition. Nothing may be lost, applied twice (over all shards)
// or added, and verify must agree.
func TestShardsSmoke(t *testing.T) {
	t.Parallel()
	r, err := RunShards(context.Background(), ShardsOptions{Shards: 3, Partitions: 64, Intents: 600, LosePubAck: 0.03, Poison: 0.01,
		Stray: 10, KillPostgres: true, Move: true, RaceMoves: true, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	WriteShards(&b, r)
	t.Logf("\n%s", b.String())
	if !r.Clean() {
		t.Fatalf("the sharded run is not clean")
	}
	// Two moves raced and a rerun to the other target: one taken, two refused.
	if len(r.MovedOwners) != 1 || r.MovesRefused != 2 {
		t.Errorf("the moved partition is owned by %v, %d raced moves refused: want one owner and 2 refused", r.MovedOwners, r.MovesRefused)
	}
	// 6 of the 600 are poison: dead-lettered, not lost.
	if r.AppliedOnce != 594 || r.DeadLettered != 6 {
		t.Errorf("applied once %d, dead-lettered %d: want 594 and 6", r.AppliedOnce, r.DeadLettered)
	}
	if r.Verify.AppliedOnce != r.AppliedOnce || r.Verify.DeadLettered != r.DeadLettered || len(r.Verify.AppliedIn) != 3 {
		t.Errorf("verify counts %d applied once, %d dead-lettered in %d shards; the run counted %d and %d",
			r.Verify.AppliedOnce, r.Verify.DeadLettered, len(r.Verify.AppliedIn), r.AppliedOnce, r.DeadLettered)
	}
}

// TestShardsMutations breaks the sharding on purpose, each time on one
// PostgreSQL with a database per shard, and shows the count and verify go
// red: without the binding check, a copy of an ID published on a key that
// is not its ID's (a producer keying by account, a re-drive on the stored
// subject) is applied in another shard; a move that does not copy the
// partition's inbox rows lets the new shard apply again what the old one
// applied; keys derived from the subject (checked as such) put a copy of
// an ID on another kind in another partition.
func TestShardsMutations(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("two more sharded runs")
	}
	for _, c := range []struct {
		name   string
		mutate func(*ShardsOptions)
	}{
		{"no binding check", func(o *ShardsOptions) { o.noBinding = true }},
		{"move without the inbox rows", func(o *ShardsOptions) { o.noCopy = true }},
		{"key from the subject, not the ID", func(o *ShardsOptions) { o.keyFromSubject = true }},
		// Fewer partitions: more of the intents go to the moved one.
		{"raced moves, any given-away row", func(o *ShardsOptions) { o.RaceMoves, o.unsafeMoves, o.Partitions, o.Intents = true, true, 6, 400 }},
		{"replay during a move, no fence", func(o *ShardsOptions) { o.RaceMoves, o.unsafeReplay = true, true }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// A third of the smoke's intents over a quarter of its
			// partitions: the strays and the moved partition, which each
			// mutation needs, are as many as there.
			o := ShardsOptions{Shards: 3, Partitions: 16, Intents: 200, Stray: 10, Move: true, OnePostgres: true, Seed: 3}
			c.mutate(&o)
			r, err := RunShards(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			WriteShards(&b, r)
			t.Logf("\n%s", b.String())
			if r.InTwoShards == 0 || r.Verify.InTwoShards == 0 || r.Verify.Clean() || r.Clean() {
				t.Errorf("mutation %q went unseen: in two shards %d (verify %d)", c.name, r.InTwoShards, r.Verify.InTwoShards)
			}
		})
	}
}

// TestShardsFlags: bad input to chaos -shards is a usage error (exit 2),
// found before anything starts.
func TestShardsFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-shards"},
		{"-shards", "x"},
		{"-shards", "1"},
		{"-shards=3", "-partitions", "2"},
		{"-shards", "3", "-intents", "0"},
		{"-shards", "3", "-lose-puback", "1"},
		{"-shards", "3", "-stray", "-1"},
		{"--shards", "3", "extra"},
	} {
		var stderr bytes.Buffer
		err := Main(context.Background(), args, io.Discard, &stderr)
		if cli.ExitCode(err) != 2 {
			t.Errorf("chaos %v: exit %d (%v), want 2", args, cli.ExitCode(err), err)
		}
	}
}

// TestShardsThroughIntake sends the sharded run's intents through the HTTP
// first hop: an intake whose keys and outbox live in a database of its
// own, publishing on partitioned subjects, with answers lost so that the
// client retries with the same key, while a partition moves between shards.
// Nothing may be lost, applied twice over all shards, or added.
func TestShardsThroughIntake(t *testing.T) {
	t.Parallel()
	r, err := RunShards(context.Background(), ShardsOptions{Shards: 3, Partitions: 16, Intents: 300, LosePubAck: 0.1, Poison: 0.01,
		Stray: 5, Move: true, OnePostgres: true, Intake: true, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	WriteShards(&b, r)
	t.Logf("\n%s", b.String())
	if !r.Clean() {
		t.Fatal("the sharded run through the intake is not clean")
	}
	// 3 of the 300 are poison; every other one applied once in the shard
	// that owned its partition when it arrived.
	if r.AppliedOnce != 297 || r.DeadLettered != 3 || r.Lost != 0 || r.Duplicated != 0 {
		t.Errorf("applied once %d, dead-lettered %d, lost %d, duplicated %d", r.AppliedOnce, r.DeadLettered, r.Lost, r.Duplicated)
	}
}

// TestShardsWithShardDurables is the sharded run with one durable per
// shard: moves raced, a PostgreSQL killed, strays; clean. Beside it, the
// same run moving without a hand-off durable loses intents: the harness
// can see what the hand-off prevents.
func TestShardsWithShardDurables(t *testing.T) {
	t.Parallel()
	for _, unsafe := range []bool{false, true} {
		o := ShardsOptions{Shards: 3, Partitions: 8, Intents: 200, LosePubAck: 0.03, Poison: 0.01,
			Stray: 5, KillPostgres: !unsafe, Move: true, RaceMoves: !unsafe, OnePostgres: true, ShardDurables: true, Seed: 4}
		if unsafe {
			o.unsafeMoves = true
		}
		r, err := RunShards(context.Background(), o)
		if err != nil {
			t.Fatalf("unsafe %v: %v", unsafe, err)
		}
		var b bytes.Buffer
		WriteShards(&b, r)
		t.Logf("unsafe %v:\n%s", unsafe, b.String())
		switch {
		case !unsafe && !r.Clean():
			t.Error("the sharded run with one durable per shard is not clean")
		case !unsafe && (len(r.MovedOwners) != 1 || r.MovesRefused != 2):
			t.Errorf("the moved partition is owned by %v, %d raced moves refused: want one owner and 2 refused", r.MovedOwners, r.MovesRefused)
		case unsafe && r.Lost == 0:
			t.Error("moves without a hand-off durable lost nothing: the run cannot show what the hand-off prevents")
		}
	}
}
