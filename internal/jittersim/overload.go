package jittersim

import (
	"cmp"
	"container/heap"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/jetinbox/jetinbox/jitter"
)

// Result is one policy's outcome in the overloaded-server simulation.
type Result struct {
	Name string
	// Kind is the jitter kind the row ran, zero for cenkalti/backoff's ExponentialBackOff.
	Kind jitter.Kind
	// Stateless reports that the row ran Policy.Delay by attempt number, as a consumer that
	// naks by delivery count does, rather than Policy.NewBackOff.
	Stateless bool
	// Done is when the last client succeeded; with Failed > 0 it covers only those that did.
	Done time.Duration
	// Median and P99 are when half and 99 % of the clients that succeeded had succeeded.
	Median, P99 time.Duration
	// Requests counts the retries sent, successful or not (the failed first requests at time 0
	// are not counted).
	Requests int
	// Peak is the most requests that arrived in one bucket.
	Peak int
	// Failed counts the clients that ran out of attempts without success.
	Failed int
	// Buckets holds the requests that arrived per bucket, Buckets[i] for bucket i.
	Buckets []int
	// Varies reports that the result draws from a source c.Seed does not control.
	Varies bool
}

// Kinds are the jitter kinds the overloaded simulation compares, in the order it reports them.
var Kinds = []jitter.Kind{jitter.None, jitter.Full, jitter.Equal, jitter.Decorrelated}

// Overload simulates c.Clients clients that all fail at time 0 (the server restarts) against a
// server that then answers at most c.Capacity requests per bucket: a request that arrives in a
// full bucket fails too, and its client retries with its next delay, at most
// c.OverloadAttempts times. Each kind of Kinds is run with jitter.Policy.NewBackOff, drawing
// from its own mulberry32(c.Seed). Then come a row "decorr(Delay)" that runs Decorrelated's
// stateless Policy.Delay(attempt) instead, and a row "backoff/v4" that runs cenkalti/backoff's
// ExponentialBackOff (RandomizationFactor 0.5, Multiplier 2) and varies from run to run.
func Overload(c Config) []Result {
	results := make([]Result, 0, len(Kinds)+1)
	for _, k := range Kinds {
		rand := NewMulberry32(c.Seed).Float64
		p := jitter.Policy{Kind: k, Base: c.Base, Cap: c.Cap, MaxAttempts: c.OverloadAttempts, Rand: rand}
		r := overload(c, func() backoff.BackOff { return p.NewBackOff() })
		r.Name, r.Kind = k.String(), k
		results = append(results, r)
	}
	{
		rand := NewMulberry32(c.Seed).Float64
		p := jitter.Policy{Kind: jitter.Decorrelated, Base: c.Base, Cap: c.Cap, Rand: rand}
		r := overload(c, func() backoff.BackOff { return &stateless{p: p, max: c.OverloadAttempts} })
		r.Name, r.Kind, r.Stateless = "decorr(Delay)", jitter.Decorrelated, true
		results = append(results, r)
	}
	r := overload(c, func() backoff.BackOff {
		exp := backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(c.Base),
			backoff.WithRandomizationFactor(0.5),
			backoff.WithMultiplier(2),
			backoff.WithMaxInterval(c.Cap),
			backoff.WithMaxElapsedTime(0),
		)
		return backoff.WithMaxRetries(exp, uint64(c.OverloadAttempts))
	})
	r.Name, r.Varies = "backoff/v4", true
	return append(results, r)
}

// Rank returns the names of the rows that ran a jitter kind with NewBackOff, best first: fewest
// clients that gave up, then fewest requests sent (the load the retries add to a server that is
// already overloaded), then lowest peak. Requests and peak give a ranking that holds across
// seeds and capacities; the time until every client succeeded is the maximum over all clients
// and too noisy to rank the jittered kinds by.
func Rank(results []Result) []string {
	var rows []Result
	for _, r := range results {
		if r.Kind != 0 && !r.Stateless && !r.Varies {
			rows = append(rows, r)
		}
	}
	slices.SortStableFunc(rows, func(a, b Result) int {
		return cmp.Or(cmp.Compare(a.Failed, b.Failed), cmp.Compare(a.Requests, b.Requests), cmp.Compare(a.Peak, b.Peak))
	})
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = r.Name
	}
	return names
}

func overload(c Config, newBackOff func() backoff.BackOff) Result {
	var (
		r       Result
		q       = make(arrivals, 0, c.Clients)
		clients = make([]backoff.BackOff, c.Clients)
		served  []int
		done    = make([]time.Duration, 0, c.Clients)
	)
	retry := func(client int, now time.Duration) {
		d := clients[client].NextBackOff()
		if d == backoff.Stop {
			r.Failed++
			return
		}
		heap.Push(&q, arrival{at: now + d, client: client})
	}
	for i := range clients {
		clients[i] = newBackOff()
		retry(i, 0) // the first request failed: the server was down
	}
	for q.Len() > 0 {
		a := heap.Pop(&q).(arrival)
		b := int(a.at / c.Bucket)
		if b >= len(served) {
			served = append(served, make([]int, b+1-len(served))...)
			r.Buckets = append(r.Buckets, make([]int, b+1-len(r.Buckets))...)
		}
		r.Requests++
		r.Buckets[b]++
		if served[b] < c.Capacity {
			served[b]++
			done = append(done, a.at) // in time order: the queue pops in time order
			continue
		}
		retry(a.client, a.at)
	}
	for _, n := range r.Buckets {
		r.Peak = max(r.Peak, n)
	}
	if len(done) > 0 {
		r.Done = done[len(done)-1]
		r.Median = done[(len(done)-1)/2]
		r.P99 = done[(len(done)-1)*99/100]
	}
	return r
}

// arrival is a request that reaches the server at a time.
type arrival struct {
	at     time.Duration
	client int
}

// arrivals is a min-heap by time, ties broken by client, so the run is deterministic.
type arrivals []arrival

func (q arrivals) Len() int { return len(q) }
func (q arrivals) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].client < q[j].client
}
func (q arrivals) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *arrivals) Push(x any)   { *q = append(*q, x.(arrival)) }
func (q *arrivals) Pop() any {
	old := *q
	a := old[len(old)-1]
	*q = old[:len(old)-1]
	return a
}

// stateless is a backoff.BackOff that calls Policy.Delay, as a consumer that naks by delivery
// count does.
type stateless struct {
	p      jitter.Policy
	max, n int
}

func (s *stateless) Reset() { s.n = 0 }

func (s *stateless) NextBackOff() time.Duration {
	if s.n >= s.max {
		return backoff.Stop
	}
	s.n++
	return s.p.Delay(s.n)
}
