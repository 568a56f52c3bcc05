package jittersim

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Row is one strategy's result in the retry storm.
type Row struct {
	Name string
	// Peak is the largest number of retries that landed in one bucket.
	Peak int
	// Total is the number of retries counted.
	Total int
	// Buckets holds the retries per bucket, Buckets[i] for bucket First+i.
	Buckets []int
	First   int64
	// Varies reports that the row draws from a source c.Seed does not control, so it changes
	// from run to run.
	Varies bool
}

// Storm runs the retry storm: c.Clients clients fail at the same instant, and each retries
// c.Attempts times, every retry failing again, so only the scheduling is measured. It returns the
// rows "no jitter", "full jitter", "equal jitter", "decorrelated", computed in float64
// milliseconds with every operation rounded on its own, drawing from one mulberry32(c.Seed)
// shared by the four in that order, so that the table is the same on every machine (TestStormTable
// pins it at the defaults); and then a row "backoff/v4" for
// cenkalti/backoff's own ExponentialBackOff (RandomizationFactor 0.5, Multiplier 2), which
// draws from math/rand's global source and so varies from run to run.
func Storm(c Config) []Row {
	rand := NewMulberry32(c.Seed).Float64
	base, capMs := ms(c.Base), ms(c.Cap)
	// Explicit float64 conversions keep Go from fusing a multiply and an add into one FMA
	// instruction (allowed by the spec, done on arm64), which rounds once instead of twice and
	// would change the table on such machines.
	strategies := []struct {
		name  string
		delay func(n int, prev float64) float64
	}{
		{"no jitter", func(n int, _ float64) float64 {
			return math.Min(capMs, base*math.Ldexp(1, n))
		}},
		{"full jitter", func(n int, _ float64) float64 {
			return rand() * math.Min(capMs, base*math.Ldexp(1, n))
		}},
		{"equal jitter", func(n int, _ float64) float64 {
			d := math.Min(capMs, base*math.Ldexp(1, n))
			return d/2 + float64(rand()*(d/2))
		}},
		{"decorrelated", func(_ int, prev float64) float64 {
			return math.Min(capMs, base+float64(rand()*(float64(prev*3)-base)))
		}},
	}
	rows := make([]Row, 0, len(strategies)+1)
	for _, s := range strategies {
		rows = append(rows, schedule(c, s.name, s.delay))
	}

	exp := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(c.Base),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMultiplier(2),
		backoff.WithMaxInterval(c.Cap),
		backoff.WithMaxElapsedTime(0),
	)
	row := schedule(c, "backoff/v4", func(n int, _ float64) float64 {
		if n == 0 {
			exp.Reset() // a new client
		}
		return ms(exp.NextBackOff())
	})
	row.Varies = true
	return append(rows, row)
}

// schedule is the storm's loop for one strategy: every client retries c.Attempts times, and
// each retry is counted in the bucket it lands in.
func schedule(c Config, name string, delay func(n int, prev float64) float64) Row {
	bucket := ms(c.Bucket)
	buckets := map[int64]int{}
	for range c.Clients {
		var t, prev float64 = 0, ms(c.Base) // decorrelated grows from Base
		for n := range c.Attempts {
			prev = delay(n, prev)
			t += prev
			buckets[int64(math.Floor(t/bucket))]++
		}
	}
	return newRow(name, buckets)
}

func newRow(name string, buckets map[int64]int) Row {
	r := Row{Name: name}
	if len(buckets) == 0 {
		return r
	}
	keys := slices.Sorted(maps.Keys(buckets))
	r.First = keys[0]
	r.Buckets = make([]int, keys[len(keys)-1]-keys[0]+1)
	for k, n := range buckets {
		r.Buckets[k-r.First] = n
		r.Total += n
		r.Peak = max(r.Peak, n)
	}
	return r
}

// ms returns d in float64 milliseconds; exact for whole milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
