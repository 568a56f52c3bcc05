package verify_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// TestVerifyPeakHeap logs verify's peak heap on a large settled stream, in
// chunks of 10,000 messages (the default) and in one chunk (everything in
// memory at once, as verify did before). A command, not part of CI:
//
//	JETINBOX_VERIFY_HEAP_MESSAGES=1000000 go test -run TestVerifyPeakHeap -v -timeout 30m ./internal/verify
//
// The stream is published directly and the inbox rows, ledger entries and
// balances are written by SQL as the consumer would have, so that only
// verify is measured.
func TestVerifyPeakHeap(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("JETINBOX_VERIFY_HEAP_MESSAGES"))
	if n <= 0 {
		t.Skip("set JETINBOX_VERIFY_HEAP_MESSAGES (e.g. 1000000) to run")
	}
	ctx := context.Background()
	e := pipelinetest.New(t, jsinbox.StreamConfig{}, 16)
	js, pool := e.JS, e.Pool
	start := time.Now()
	payload := func(i int) []byte { return fmt.Appendf(nil, `{"account":%d,"amount":%d}`, 1+i%16, 1+i%100) }
	for i := range n {
		if _, err := js.PublishAsync("intents.h", payload(i), jetstream.WithMsgID("h-"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
		if i%10000 == 9999 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				t.Fatal("publish stalled")
			}
		}
	}
	<-js.PublishAsyncComplete()
	for _, q := range []string{
		`INSERT INTO inbox (scope, message_id, fingerprint, stream_seq)
SELECT 'ledger', 'h-' || g, sha256(convert_to(format('{"account":%s,"amount":%s}', 1 + g % 16, 1 + g % 100), 'UTF8')), g + 1
FROM generate_series(0, $1 - 1) g`,
		`INSERT INTO ledger_entries (scope, message_id, account, amount)
SELECT 'ledger', 'h-' || g, 1 + g % 16, 1 + g % 100 FROM generate_series(0, $1 - 1) g`,
		`UPDATE accounts a SET balance = s.sum FROM (SELECT account, sum(amount) AS sum FROM ledger_entries GROUP BY account) s WHERE a.id = s.account AND $1 > 0`,
		`ANALYZE`,
	} {
		if _, err := pool.Exec(ctx, q, n); err != nil && q != `ANALYZE` {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Logf("%d messages, inbox rows and ledger entries in %v", n, time.Since(start).Round(time.Second))

	for _, c := range []struct {
		name  string
		chunk int
	}{{"chunks of 10,000", 0}, {"one chunk", 1 << 30}} {
		runtime.GC()
		var base runtime.MemStats
		runtime.ReadMemStats(&base)
		var peak atomic.Uint64
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			var ms runtime.MemStats
			for {
				runtime.ReadMemStats(&ms)
				if ms.HeapAlloc > peak.Load() {
					peak.Store(ms.HeapAlloc)
				}
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		t0 := time.Now()
		r, err := verify.Run(ctx, js, pool, verify.WithChunk(verify.Options{Scope: "ledger", Ledger: true}, c.chunk))
		close(stop)
		<-done
		if err != nil {
			t.Fatal(err)
		}
		if !r.Clean() || r.StreamMessages != n || r.AppliedOnce != n {
			t.Fatalf("%s: %+v", c.name, r)
		}
		t.Logf("%-17s %d messages in %v, peak heap %d MiB (%d MiB before; the embedded NATS server included)", c.name, n, time.Since(t0).Round(100*time.Millisecond),
			peak.Load()>>20, base.HeapAlloc>>20)
	}
}
