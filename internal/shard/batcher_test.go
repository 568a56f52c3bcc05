package shard

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/jitter"
)

// fastNak redelivers a refused message soon: a moved partition's messages
// come back to its new owner within the test.
var fastNak = jitter.Policy{Kind: jitter.Decorrelated, Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}

// applyRows is an effect that writes a row per message in the batch's
// transaction (so a rolled-back batch leaves none) with whether its
// partition's row said owned in that transaction, and remembers the most
// partitions one batch held.
type applyRows struct {
	m       *Map
	mu      sync.Mutex
	maxPart int
}

func (a *applyRows) Handle(ctx context.Context, tx pgx.Tx, msgs []inbox.Message, _ []error) error {
	parts := map[int]bool{}
	ids := make([]string, len(msgs))
	ps := make([]int, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
		if p, err := ParseStored(a.m.Subject, m.Subject); err == nil {
			parts[p.Partition] = true
			ps[i] = p.Partition
		}
	}
	a.mu.Lock()
	a.maxPart = max(a.maxPart, len(parts))
	a.mu.Unlock()
	_, err := tx.Exec(ctx, `INSERT INTO applied (id, owned)
SELECT u.id, coalesce((SELECT owned FROM jetinbox_partitions WHERE scope = $3 AND partition = u.p), false)
FROM unnest($1::text[], $2::int[]) AS u(id, p)`, ids, ps, a.m.Scope)
	return err
}

// TestOneBatcherAcrossMoves runs two shards, each with one batcher over its
// partition durables, while intents flow and partitions move both ways:
// every intent is applied exactly once over both shards, and batches hold
// messages of several partitions (one transaction for the shard, not one
// per partition).
func TestOneBatcherAcrossMoves(t *testing.T) {
	ctx := context.Background()
	m := (&Map{Partitions: 8, Shards: []Shard{{Name: "a", DatabaseURL: "x", Partitions: Set{0, 1, 2, 3}}, {Name: "b", DatabaseURL: "y", Partitions: Set{4, 5, 6, 7}}}}).WithDefaults()
	pools := newShardPools(t, &m)
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := m.EnsureStream(ctx, js, jsinbox.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	effects := map[string]*applyRows{}
	runners := map[string]*Runner{}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for _, name := range []string{"a", "b"} {
		if _, err := pools[name].Exec(ctx, `CREATE TABLE applied (id text NOT NULL, owned bool NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		effects[name] = &applyRows{m: &m}
		inner, err := inbox.NewProcessor(pginbox.New(pools[name]), inbox.Handler[pgx.Tx](&Fenced{Map: &m, Inner: effects[name]}), inbox.Config{Scope: m.Scope})
		if err != nil {
			t.Fatal(err)
		}
		// The partition table is read once a second: for up to a second
		// after a move the source's runner still takes the partition's
		// messages, and only the fence in each batch's transaction keeps
		// it from applying them.
		r := &Runner{JS: js, Pool: pools[name], Map: &m, Proc: NewProcessor(inner, &m), Poll: time.Second,
			Consumer: jsinbox.ConsumerConfig{AckWait: 5 * time.Second, Nak: fastNak}}
		runners[name] = r
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(rctx); err != nil {
				t.Errorf("shard %s: %v", name, err)
			}
		}()
	}
	const n = 600
	published := make(chan error, 1)
	go func() {
		for i := range n {
			id := fmt.Sprintf("intent-%d", i)
			msg := &nats.Msg{Subject: PublishSubject(m.Subject, id, "ledger.credit"), Data: []byte("{}"), Header: nats.Header{}}
			msg.Header.Set(jetstream.MsgIDHeader, id)
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				published <- err
				return
			}
			if i%10 == 0 {
				time.Sleep(20 * time.Millisecond) // let batches of a few partitions form while moves run
			}
		}
		published <- nil
	}()
	// Moves both ways while the intents flow: 0 from a to b, 5 from b to
	// a, then 0 back to a.
	side := func(name string) Side { return Side{name, pools[name]} }
	for _, mv := range []struct {
		p        int
		from, to string
	}{{0, "a", "b"}, {5, "b", "a"}, {0, "b", "a"}} {
		time.Sleep(400 * time.Millisecond)
		if _, err := Move(ctx, &m, mv.p, side(mv.from), side(mv.to)); err != nil {
			t.Fatalf("move %d %s→%s: %v", mv.p, mv.from, mv.to, err)
		}
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	counts := func() (total int, perID map[string]int) {
		perID = map[string]int{}
		for _, p := range []*pgxpool.Pool{pools["a"], pools["b"]} {
			rows, err := p.Query(ctx, `SELECT id FROM applied`)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				perID[id]++
			}
			total += len(ids)
		}
		return total, perID
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, perID := counts()
		if len(perID) == n || time.Now().After(deadline) {
			if len(perID) != n {
				t.Fatalf("applied %d of %d intents within 3 minutes", len(perID), n)
			}
			// The last redeliveries settle: a second apply would show now.
			time.Sleep(500 * time.Millisecond)
			total, perID := counts()
			for id, k := range perID {
				if k != 1 {
					t.Errorf("%s applied %d times over the shards", id, k)
				}
			}
			if total != n {
				t.Errorf("%d applies of %d intents", total, n)
			}
			for name, p := range pools {
				var outside int
				if err := p.QueryRow(ctx, `SELECT count(*) FROM applied WHERE NOT owned`).Scan(&outside); err != nil || outside != 0 {
					t.Errorf("shard %s applied %d intents of partitions it did not own in that transaction (%v)", name, outside, err)
				}
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	most := 0
	for _, e := range effects {
		e.mu.Lock()
		most = max(most, e.maxPart)
		e.mu.Unlock()
	}
	if most < 2 {
		t.Errorf("no batch held messages of more than one partition (most %d): each partition formed its own batches", most)
	}
	for name, want := range map[string]Set{"a": {0, 1, 2, 3, 5}, "b": {4, 6, 7}} {
		if got, err := Owned(ctx, pools[name], m.Scope); err != nil || got.String() != want.String() {
			t.Errorf("shard %s owns %v (%v), want %v", name, got, err, want)
		}
	}
}
