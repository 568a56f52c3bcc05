package cli

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/metrics"
)

// failingProc is a processor whose every transaction fails, as on a
// database that does not answer: a rescue naks its advisories and they
// wait.
type failingProc struct{ *inbox.Processor[pgx.Tx] }

func (failingProc) Process(context.Context, []inbox.Message) ([]inbox.Outcome, error) {
	return nil, errors.New("database unreachable (test)")
}

// TestRescueBacklogShown: messages the server gave up on wait for their
// rescue while it cannot settle them. The consumer's
// jetinbox_rescue_backlog gauge and its /readyz detail say how many; once
// a consumer that can settle them runs, the backlog is 0.
func TestRescueBacklogShown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pipelinetest.New(t, jsinbox.StreamConfig{}, 16)
	const n = 5
	for i := range n {
		if _, err := e.JS.Publish(ctx, "intents.1", effects.Intent{Account: 1, Amount: 1}.AppendJSON(nil),
			jetstream.WithMsgID("backlog-"+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	// The server gives up on each after one delivery nobody settles.
	cons, err := e.JS.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{Durable: "ledger",
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 1, AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range b.Messages() {
	}
	adv, err := e.JS.Stream(ctx, jsinbox.AdvisoryStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		// A pull left waiting makes the server give up once AckWait ran out.
		_, _ = cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if info, err := adv.Info(ctx); err == nil && info.State.Msgs == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not give up on the messages")
		}
	}

	run := func(proc jsinbox.BatchProcessor) (*jsinbox.Consumer, *prometheus.Registry, func()) {
		reg := prometheus.NewRegistry()
		m, err := metrics.NewConsumer(reg)
		if err != nil {
			t.Fatal(err)
		}
		c, err := jsinbox.NewConsumer(e.JS, proc, jsinbox.ConsumerConfig{Observer: m})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		return c, reg, func() {
			stop()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	backlog := func(c *jsinbox.Consumer, reg *prometheus.Registry) (float64, string) {
		h := httpHandler(c, e.JS.Conn(), reg)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "jetinbox_rescue_backlog" {
				return mf.GetMetric()[0].GetGauge().GetValue(), rec.Body.String()
			}
		}
		return -1, rec.Body.String()
	}
	inner, err := inbox.NewProcessor(pginbox.New(e.Pool), effects.NewLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	c, reg, stop := run(failingProc{inner})
	var got float64
	var body string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if got, body = backlog(c, reg); got == n && strings.Contains(body, "rescue backlog: 5 max-deliveries advisories not yet settled") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with a rescue that cannot settle: jetinbox_rescue_backlog %v, /readyz %q; want %d in both", got, body, n)
		}
	}
	if s := c.Stats(); s.Rescued != 0 {
		t.Fatalf("rescued %d with a failing database", s.Rescued)
	}
	stop()

	c, reg, stop = run(inner)
	defer stop()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if got, body = backlog(c, reg); got == 0 && c.Stats().Rescued == n && !strings.Contains(body, "rescue backlog") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the rescue: jetinbox_rescue_backlog %v, rescued %d, /readyz %q", got, c.Stats().Rescued, body)
		}
	}
	if n := testutil.CollectAndCount(reg, "jetinbox_rescue_backlog"); n != 1 {
		t.Fatalf("%d jetinbox_rescue_backlog series", n)
	}
}
