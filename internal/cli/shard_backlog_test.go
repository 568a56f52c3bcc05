package cli

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/shard"
)

// TestShardRescueBacklogShown: a shard's /readyz shows the rescue backlog
// of its partitions as the consumer's /readyz shows its own: messages the
// server gave up on in two partitions wait while the rescue cannot settle
// them, and /readyz says how many, summed and by partition; once the
// rescue can settle them, the line is gone.
func TestShardRescueBacklogShown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pipelinetest.New(t, jsinbox.StreamConfig{}, 16)
	m := shard.Map{Partitions: 2, Shards: []shard.Shard{{Name: "a", DatabaseURLEnv: "SHARD_A_URL", Partitions: shard.Set{0, 1}}}}
	m = m.WithDefaults()
	if err := m.EnsureStream(ctx, e.JS, jsinbox.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := shard.Migrate(ctx, e.Pool, &m, "a"); err != nil {
		t.Fatal(err)
	}
	// Three given up on in each partition: each durable delivers them once
	// and nobody settles them.
	const each = 3
	in := map[int]int{}
	for i := 0; in[0] < each || in[1] < each; i++ {
		id := fmt.Sprintf("shard-backlog-%d", i)
		p := shard.PartitionOf(id, m.Partitions)
		if in[p] == each {
			continue
		}
		in[p]++
		if _, err := e.JS.Publish(ctx, shard.PublishSubject(m.Subject, id, "ledger.1"), effects.Intent{Account: 1, Amount: 1}.AppendJSON(nil), jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	for p := range m.Partitions {
		cons, err := e.JS.CreateConsumer(ctx, m.Stream, jetstream.ConsumerConfig{Durable: m.Durable(p), FilterSubject: m.Filter(p),
			AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 1, AckWait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		b, err := cons.Fetch(each, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range b.Messages() {
		}
		t.Cleanup(func() { _, _ = cons.Fetch(1, jetstream.FetchMaxWait(time.Millisecond)) })
		adv, err := e.JS.Stream(ctx, jsinbox.AdvisoryStream(m.Stream))
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; {
			// A pull left waiting makes the server give up once AckWait ran out.
			_, _ = cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
			if info, err := adv.Info(ctx); err == nil && info.State.Msgs == uint64(each*(p+1)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the server did not give up on partition %d's messages", p)
			}
		}
	}

	inner, err := inbox.NewProcessor(pginbox.New(e.Pool), inbox.Handler[pgx.Tx](&shard.Fenced{Map: &m, Inner: effects.NewLedger()}), inbox.Config{Scope: m.Scope})
	if err != nil {
		t.Fatal(err)
	}
	run := func(batch jsinbox.BatchProcessor) (*shard.Runner, func()) {
		r := &shard.Runner{JS: e.JS, Pool: e.Pool, Map: &m, Proc: shard.NewProcessor(inner, &m), Batch: batch, Poll: 100 * time.Millisecond}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		for deadline := time.Now().Add(20 * time.Second); len(r.Running()) < m.Partitions; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("partitions %v run, want all %d", r.Running(), m.Partitions)
			}
		}
		return r, func() {
			stop()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	readyz := func(r *shard.Runner) string {
		rec := httptest.NewRecorder()
		shardHTTPHandler(r, e.NC, prometheus.NewRegistry()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Body.String()
	}
	r, stop := run(failingProc{inner})
	want := fmt.Sprintf("rescue backlog: %d max-deliveries advisories not yet settled (jetinbox_rescue_backlog), by partition 0: %d, 1: %d", 2*each, each, each)
	var body string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if body = readyz(r); strings.Contains(body, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with a rescue that cannot settle: /readyz %q; want %q", body, want)
		}
	}
	stop()

	r, stop = run(nil)
	defer stop()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		settled := true
		for p := range m.Partitions {
			rc, err := e.JS.Consumer(ctx, jsinbox.AdvisoryStream(m.Stream), m.Durable(p))
			if err != nil {
				t.Fatal(err)
			}
			info, err := rc.Info(ctx)
			settled = settled && err == nil && info.NumPending+uint64(info.NumAckPending) == 0
		}
		if body = readyz(r); settled && strings.HasPrefix(body, "ready") && !strings.Contains(body, "rescue backlog") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the rescue: /readyz %q, want ready without a backlog", body)
		}
	}
}
