// The approaches measured side by side (the raw pipe, the naive consumer,
// jetinbox), the database each gets, and the ledger check after each.

package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/cli"
)

// runRaw is the ceiling of the pipe: fetch and ack, nothing else.
func runRaw(ctx context.Context, c jetstream.Consumer, _ *cli.Store, n int) error {
	var got atomic.Int64
	done := make(chan struct{})
	cc, err := c.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		if got.Add(1) == int64(n) {
			close(done)
		}
	}, jetstream.PullMaxMessages(4096))
	if err != nil {
		return err
	}
	defer cc.Stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runNaive is what most people write: one transaction per message on one
// connection, then ack.
func runNaive(ctx context.Context, c jetstream.Consumer, store *cli.Store, n int) error {
	proc, err := store.LedgerProcessor(inbox.Config{Scope: "ledger"})
	if err != nil {
		return err
	}
	it, err := c.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return err
	}
	defer it.Stop()
	for i := 0; i < n; i++ {
		m, err := it.Next()
		if err != nil {
			return err
		}
		msg := jsinbox.InboxMessage(m)
		out, err := proc.Process(ctx, []inbox.Message{msg})
		if err != nil || !out[0].Ackable() {
			return fmt.Errorf("naive: %v %v", err, out[0].Reason)
		}
		_ = m.Ack()
	}
	return nil
}

type countObserver struct {
	applied atomic.Int64
	first   atomic.Pointer[time.Time] // when the first batch committed
	done    chan struct{}
	n       int64
	once    sync.Once
	mu      sync.Mutex
	lat     []time.Duration
	latency bool
}

func (o *countObserver) ObserveBatch(b jsinbox.BatchReport) {
	if o.first.Load() == nil {
		ended := b.Ended
		o.first.CompareAndSwap(nil, &ended)
	}
	var k int64
	for i, out := range b.Outcomes {
		if out.Ackable() {
			k++
			if o.latency {
				o.mu.Lock()
				o.lat = append(o.lat, b.Ended.Sub(b.Messages[i].Published))
				o.mu.Unlock()
			}
		}
	}
	if o.applied.Add(k) >= o.n {
		o.once.Do(func() { close(o.done) })
	}
}

func runJetinbox(ctx context.Context, js jetstream.JetStream, c jetstream.Consumer, store *cli.Store, n int, o Options) error {
	obs := &countObserver{done: make(chan struct{}), n: int64(n)}
	return consumeWith(ctx, js, c, store, o, obs, func() error {
		select {
		case <-obs.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// consumeWith runs o.Consumers jetinbox consumers on c's durable (each with
// its own processor, as separate processes would be) until wait returns.
func consumeWith(ctx context.Context, js jetstream.JetStream, c jetstream.Consumer, store *cli.Store, o Options, obs jsinbox.Observer, wait func() error) error {
	info := c.CachedInfo()
	k := max(o.Consumers, 1)
	all := make([]*jsinbox.Consumer, k)
	warm := make([]*warmSignal, k)
	for i := range all {
		var proc jsinbox.BatchProcessor
		if o.followUps {
			// The outbox lives in PostgreSQL: the ledger with follow-ups
			// runs there only.
			h, err := o.handler()
			if err != nil {
				return err
			}
			proc, err = inbox.NewProcessor(pginbox.New(store.PG), h, inbox.Config{Scope: "ledger"})
			if err != nil {
				return err
			}
		} else {
			var err error
			proc, err = store.LedgerProcessor(inbox.Config{Scope: "ledger"})
			if err != nil {
				return err
			}
		}
		warm[i] = newWarmSignal(proc)
		var err error
		all[i], err = jsinbox.NewConsumer(js, warm[i], jsinbox.ConsumerConfig{
			Stream: info.Stream, Durable: info.Name, BatchSize: o.Batch, InFlight: o.InFlight,
			AckWait: time.Minute, MaxAckPending: 50_000, Observer: obs,
			DeliverPolicy: info.Config.DeliverPolicy, OptStartSeq: info.Config.OptStartSeq,
		})
		if err != nil {
			return err
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, k)
	for _, cons := range all {
		go func() { done <- cons.Run(rctx) }()
	}
	waited := make(chan error, 1)
	go func() {
		// Start the clock of a latency phase once the consumers are
		// connected, warmed up (their connections open and prepared)
		// and pulling, as a running service is.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			ready := 0
			for i, cons := range all {
				if cons.Ready() && warm[i].warmed() {
					ready++
				}
			}
			if ready == k {
				break
			}
		}
		waited <- wait()
	}()
	select {
	case err := <-done: // a consumer stopped on its own: a failure
		return fmt.Errorf("consumer stopped: %v", err)
	case werr := <-waited:
		cancel()
		for range k {
			if err := <-done; err != nil {
				return err
			}
		}
		return werr
	}
}

// checkLedger: every ID exactly once, balances exact.
func checkLedger(ctx context.Context, store *cli.Store, n int, want int64) error {
	var entries, distinct int
	var total int64
	if err := queryRow(ctx, store, `SELECT count(*), count(DISTINCT message_id), coalesce(sum(amount), 0) FROM ledger_entries`, &entries, &distinct, &total); err != nil {
		return err
	}
	var bal int64
	if err := queryRow(ctx, store, `SELECT coalesce(sum(balance), 0) FROM accounts`, &bal); err != nil {
		return err
	}
	if entries != n || distinct != n || total != want || bal != want {
		return fmt.Errorf("ledger check failed: %d entries, %d distinct IDs (want %d), amounts %d, balances %d (want %d)",
			entries, distinct, n, total, bal, want)
	}
	return nil
}
