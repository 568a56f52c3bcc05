package pgdelivery_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/internal/jittersim"
	"github.com/jetinbox/jetinbox/jitter"
)

// stormReceiver is down (503) until up is closed, then answers 200; it
// keeps the time of every request.
type stormReceiver struct {
	mu    sync.Mutex
	times []time.Time
	upAt  time.Time
}

func (s *stormReceiver) handler(up <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.times = append(s.times, time.Now())
		s.mu.Unlock()
		select {
		case <-up:
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}
}

// split returns the request times before and from t.
func (s *stormReceiver) split(t time.Time) (before, after []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range s.times {
		if x.Before(t) {
			before = append(before, x)
		} else {
			after = append(after, x)
		}
	}
	return before, after
}

const (
	stormRows        = 200
	stormDispatchers = 4
	stormOutage      = time.Second
)

// A receiver that goes down and comes back is not stormed: the retry
// storm's measure (peak requests in one 10 ms bucket) taken from the
// moment it is back, for jetinbox's dispatchers (per-endpoint
// concurrency, jittered breakers and retries) beside a naive retry loop
// (every delivery retried every 100 ms until it succeeds), same rows, same
// live endpoint.
func TestStormAfterRecovery(t *testing.T) {
	oursDown, oursBack := stormDispatcher(t, jitter.Decorrelated)
	naiveDown, naiveBack := stormNaive(t)
	t.Logf("\n%d deliveries, receiver down %v then back; peak = most requests in one 10 ms bucket\n"+
		"%-22s %12s %14s %12s %14s\n%-22s %12d %14d %12d %14d\n%-22s %12d %14d %12d %14d", stormRows, stormOutage,
		"", "down: peak", "down: requests", "back: peak", "back: requests",
		"jetinbox deliver ×4", oursDown.Peak, oursDown.Total, oursBack.Peak, oursBack.Total,
		"naive retry loop", naiveDown.Peak, naiveDown.Total, naiveBack.Peak, naiveBack.Total)
	// While it is down the breakers hold the calls back: a few probes,
	// not a retry of every delivery every round.
	if oursDown.Total*2 > naiveDown.Total {
		t.Errorf("while down: %d requests, not half of the naive loop's %d", oursDown.Total, naiveDown.Total)
	}
}

func stormDispatcher(t *testing.T, kind jitter.Kind) (down, back jittersim.Row) {
	st, pool := newStore(t)
	up := make(chan struct{})
	var sr stormReceiver
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) { sr.handler(up)(w, r) })
	add(t, pool, "storm", "m", stormRows)
	ep := endpoint("storm", rc.URL)
	for range stormDispatchers {
		run(t, st, delivery.Config{Endpoints: []delivery.Endpoint{ep},
			Retry:   jitter.Policy{Kind: kind, Base: 100 * time.Millisecond, Cap: time.Second},
			Breaker: delivery.BreakerConfig{Failures: 3, Open: jitter.Policy{Kind: kind, Base: 200 * time.Millisecond, Cap: time.Second}}})
	}
	time.Sleep(stormOutage) // the outage: what the test is about
	backAt := time.Now()
	close(up)
	waitState(t, st, "storm", delivery.StateDelivered, stormRows)
	b, a := sr.split(backAt)
	return jittersim.Measure("down", b, 10*time.Millisecond), jittersim.Measure("back", a, 10*time.Millisecond)
}

func stormNaive(t *testing.T) (down, back jittersim.Row) {
	up := make(chan struct{})
	var sr stormReceiver
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) { sr.handler(up)(w, r) })
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: stormRows}, Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i := range stormRows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rc.URL, nil)
				req.Header.Set("Idempotency-Key", fmt.Sprint(i))
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
					if resp.StatusCode == 200 {
						return
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	time.Sleep(stormOutage)
	backAt := time.Now()
	close(up)
	wg.Wait()
	b, a := sr.split(backAt)
	return jittersim.Measure("naive down", b, 10*time.Millisecond), jittersim.Measure("naive back", a, 10*time.Millisecond)
}
