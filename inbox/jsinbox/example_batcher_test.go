package jsinbox_test

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// Two durables, one filtered on each half of the subjects, whose messages
// join one stream of batches: each transaction holds what arrived from
// both. The batcher runs before the consumers and stops after them.
func ExampleBatcher() {
	var (
		js   jetstream.JetStream    // connected to the server
		proc jsinbox.BatchProcessor // one processor for both: a batch is one transaction
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := jsinbox.NewBatcher(6000, 2)
	bctx, stopBatcher := context.WithCancel(context.WithoutCancel(ctx))
	batcherDone := make(chan struct{})
	go func() {
		defer close(batcherDone)
		b.Run(bctx)
	}()
	var wg sync.WaitGroup
	for _, half := range []string{"intents.a.>", "intents.b.>"} {
		c, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{
			Durable: "ledger_" + half[8:9], FilterSubjects: []string{half}, Batcher: b,
		})
		if err != nil {
			panic(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.Run(ctx) // returns once the batcher settled all it was given
		}()
	}
	// ... until it is time to stop:
	cancel()
	wg.Wait()
	stopBatcher()
	<-batcherDone
}
