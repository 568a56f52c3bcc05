package pgdelivery_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/internal/deliverchaos/storm"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// Deliveries that failed together do not return together, against a live
// endpoint that comes back. Every dispatcher's calls are in flight when
// the receiver fails them all at once, so every dispatcher's breaker opens
// at the same instant (as when a receiver's crash resets every
// connection); the receiver answers 503 for 800 ms, shorter than any
// breaker's first open time, then comes back answering each request in
// 100 ms. The same code runs twice, side by side: as shipped (breaker open
// times and retries jittered), and with jitter off (jitter.None). Without
// jitter every breaker probes at the same instant and every dispatcher
// resumes at the same instant; with it they come back one by one. A naive
// retry loop (every delivery every 100 ms) is the third row, for what no
// breaker looks like. The table prints the retry storm's measure (peak
// requests in one 10 ms bucket) while down and from the moment it is back.
func TestStormAfterRecovery(t *testing.T) {
	o := storm.Defaults()
	// Smaller than the command's run (jetinbox chaos -deliver -storm):
	// 200 deliveries, 20 dispatchers × 2 slots.
	o.Rows, o.Dispatchers, o.Answer = 200, 20, 100*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := storm.Run(ctx, testenv.NewDatabase(t), o)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	storm.Print(&b, o, res)
	t.Log("\n" + b.String())
	ours, flat, naive := res[storm.Jittered], res[storm.NoJitter], res[storm.Naive]
	// The claim, live: the dispatchers come back one by one with the
	// breakers' jitter, all at once without it. Counted as senders whose
	// first request after the receiver came back falls within one 200 ms
	// window (the peak per 10 ms bucket is printed, and asserted on a
	// simulated clock in package delivery's TestStormSimulatedClock: on a
	// loaded machine PostgreSQL's leases smear requests sent at the same
	// instant over tens of milliseconds). A generous margin: runs measured
	// 20 of 20 against about 5.
	if ours.Together*2 > flat.Together {
		t.Errorf("back: %d of %d jittered dispatchers came back within %v, not under half of the %d without jitter: the breakers came back together",
			ours.Together, ours.Senders, storm.ReturnWindow, flat.Together)
	}
	// While it is down the breakers hold the calls back: a few probes,
	// not a retry of every delivery every round.
	if ours.Down.Total*2 > naive.Down.Total {
		t.Errorf("while down: %d requests, not half of the naive loop's %d", ours.Down.Total, naive.Down.Total)
	}
}
