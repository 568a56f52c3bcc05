package delivery

import (
	"container/heap"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/jitter"
)

// simStorm plays the storm after recovery on a simulated clock through the
// real breaker code: dispatchers breakers (one per dispatcher, as
// processes have), slots calls each, every one in flight when the
// receiver fails them all at the same instant (t = 0); the receiver is
// down (an immediate 503) until back, then answers each call after
// answer. Each dispatcher's loop is modelled as the real one runs: ask its
// breaker for slots, take that many due rows, retry a failed row after
// Retry.Delay(attempt); rows = dispatchers × slots. It returns the time
// of every request the receiver saw from back on.
func simStorm(kind jitter.Kind, seed uint64, dispatchers, slots int, back, answer time.Duration) []time.Time {
	rng := rand.New(rand.NewPCG(seed, 1))
	retry := jitter.Policy{Kind: kind, Base: 200 * time.Millisecond, Cap: time.Second, Rand: rng.Float64}
	cfg := BreakerConfig{Failures: slots, Open: jitter.Policy{Kind: kind, Base: time.Second, Cap: 5 * time.Second, Rand: rng.Float64}}.withDefaults()
	t0 := time.Unix(1e9, 0)
	type row struct {
		due      time.Time
		attempts int
		done     bool
	}
	rows := make([]*row, dispatchers*slots)
	for i := range rows {
		rows[i] = &row{attempts: 1}
	}
	type disp struct {
		br       *breaker
		inflight int
	}
	ds := make([]*disp, dispatchers)
	var q events
	var seen []time.Time
	left := len(rows)
	// t = 0: every slot's call fails at once.
	for i := range ds {
		ds[i] = &disp{br: &breaker{cfg: cfg}}
		for s := range slots {
			r := rows[i*slots+s]
			ds[i].br.record(t0, false)
			r.due = t0.Add(retry.Delay(r.attempts))
		}
		heap.Push(&q, event{at: t0, disp: i})
	}
	for q.Len() > 0 && left > 0 {
		e := heap.Pop(&q).(event)
		d := ds[e.disp]
		if e.row != nil {
			// A call ends.
			r := e.row.(*row)
			d.inflight--
			ok := e.ok
			d.br.record(e.at, ok)
			if ok {
				r.done = true
				left--
			} else {
				r.attempts++
				r.due = e.at.Add(retry.Delay(r.attempts - 1))
			}
			heap.Push(&q, event{at: e.at, disp: e.disp})
			continue
		}
		// The loop: ask the breaker, take due rows.
		free := slots - d.inflight
		if free == 0 {
			continue // a call's end polls again
		}
		n, retryAt := d.br.slots(e.at, free)
		if n == 0 {
			heap.Push(&q, event{at: retryAt, disp: e.disp})
			continue
		}
		took := 0
		var soonest time.Time
		for _, r := range rows {
			if took == n {
				break
			}
			if r.done || r.due.IsZero() {
				continue
			}
			if r.due.After(e.at) {
				if soonest.IsZero() || r.due.Before(soonest) {
					soonest = r.due
				}
				continue
			}
			took++
			d.inflight++
			r.due = time.Time{} // leased
			var end time.Time
			ok := !e.at.Before(t0.Add(back))
			if ok {
				end = e.at.Add(answer)
				seen = append(seen, e.at)
			} else {
				end = e.at.Add(time.Millisecond)
			}
			heap.Push(&q, event{at: end, disp: e.disp, row: r, ok: ok})
		}
		if took == 0 {
			d.br.unprobeIfProbing()
			if !soonest.IsZero() {
				heap.Push(&q, event{at: soonest, disp: e.disp})
			} else if d.inflight == 0 {
				heap.Push(&q, event{at: e.at.Add(200 * time.Millisecond), disp: e.disp})
			}
		}
	}
	return seen
}

type event struct {
	at   time.Time
	disp int
	row  any // a call's end, or nil: a poll
	ok   bool
}

type events []event

func (q events) Len() int           { return len(q) }
func (q events) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q events) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *events) Push(x any)        { *q = append(*q, x.(event)) }
func (q *events) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// A thousand deliveries that failed together do not return together, on a
// simulated clock through the real breaker: 100 dispatchers × 10 slots,
// every call failed at the same instant, the receiver back after 800 ms
// (before any breaker's first probe) and answering in 200 ms. Peak
// requests in one 10 ms bucket from the moment it is back, the breaker and
// retries as shipped (decorrelated jitter) beside the same code with
// jitter off (jitter.None), several seeds. Without jitter every breaker
// probes in the same millisecond and every dispatcher resumes in the same
// millisecond.
func TestStormSimulatedClock(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		flat := measure(simStorm(jitter.None, seed, 100, 10, 800*time.Millisecond, 200*time.Millisecond))
		ours := measure(simStorm(jitter.Decorrelated, seed, 100, 10, 800*time.Millisecond, 200*time.Millisecond))
		t.Logf("seed %d: back peak %d (jittered) against %d (jitter off); %d and %d requests", seed, ours.Peak, flat.Peak, ours.Total, flat.Total)
		if ours.Total != 1000 || flat.Total != 1000 {
			t.Fatalf("seed %d: %d and %d requests after the receiver is back, want 1000 each (every delivery once)", seed, ours.Total, flat.Total)
		}
		if ours.Peak*4 > flat.Peak {
			t.Errorf("seed %d: the jittered breakers' peak %d is not under a quarter of the peak without jitter (%d): a thousand deliveries that failed together came back together", seed, ours.Peak, flat.Peak)
		}
	}
}

// peak is the retry storm's measure (internal/jittersim's, which this
// package's tests cannot import): the most requests in one 10 ms bucket.
type peak struct{ Peak, Total int }

func measure(times []time.Time) peak {
	buckets := map[int64]int{}
	var p peak
	for _, t := range times {
		k := t.UnixNano() / int64(10*time.Millisecond)
		buckets[k]++
		p.Peak = max(p.Peak, buckets[k])
		p.Total++
	}
	return p
}
