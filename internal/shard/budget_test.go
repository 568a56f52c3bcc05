package shard

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestRunnerSharesBudgetOverOwned: the shard's memory budget is shared out
// over the partitions its database says it owns, not the map file's: a
// shard given two more partitions by moves (the file not rewritten yet)
// must not hold twice its budget.
func TestRunnerSharesBudgetOverOwned(t *testing.T) {
	ctx := context.Background()
	m := (&Map{Partitions: 8, Shards: []Shard{{Name: "a", DatabaseURL: "x", Partitions: Set{0, 1}}, {Name: "b", DatabaseURL: "y", Partitions: Set{2, 3, 4, 5, 6, 7}}}}).WithDefaults()
	pool := newShardPools(t, &m)["a"]
	if _, err := pool.Exec(ctx, `INSERT INTO jetinbox_partitions (scope, partition, owned) VALUES ($1, 2, true), ($1, 3, true)`, m.Scope); err != nil {
		t.Fatal(err)
	}
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	inner, err := inbox.NewProcessor(pginbox.New(pool), inbox.Handler[pgx.Tx](&Fenced{Map: &m, Inner: &recorder{}}), inbox.Config{Scope: m.Scope})
	if err != nil {
		t.Fatal(err)
	}
	const budget = 64 << 20
	var mu sync.Mutex
	got := map[int]int64{}
	r := &Runner{JS: js, Pool: pool, Map: &m, Proc: NewProcessor(inner, &m), MaxBytes: budget, Poll: 50 * time.Millisecond,
		OnConsumer: func(p int, c *jsinbox.Consumer) {
			mu.Lock()
			got[p] = c.Config().MaxBytes
			mu.Unlock()
		}}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var total int64
	for p, b := range got {
		total += b
		if b != budget/4 {
			t.Errorf("partition %d's consumer holds up to %d bytes, want a quarter of %d: the shard owns 4 partitions", p, b, budget)
		}
	}
	if len(got) != 4 || total > budget {
		t.Errorf("%d partition consumers hold up to %d bytes together, budget %d", len(got), total, budget)
	}
}
