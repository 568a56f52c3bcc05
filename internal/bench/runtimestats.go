// The Go runtime's share of a latency phase: GC pauses and how long
// goroutines waited to run, from runtime/metrics.

package bench

import (
	"fmt"
	"math"
	"runtime/metrics"
	"time"
)

// runtimeWindow is the runtime's histograms at the start of a phase.
type runtimeWindow struct {
	samples []metrics.Sample
}

const (
	gcPauses     = "/sched/pauses/total/gc:seconds"
	schedLatency = "/sched/latencies:seconds"
	gcCycles     = "/gc/cycles/total:gc-cycles"
)

func readRuntime() []metrics.Sample {
	s := []metrics.Sample{{Name: gcPauses}, {Name: schedLatency}, {Name: gcCycles}}
	metrics.Read(s)
	return s
}

// startRuntimeWindow takes the runtime's histograms now.
func startRuntimeWindow() runtimeWindow { return runtimeWindow{samples: readRuntime()} }

// runtimeStats is what the runtime did in a window: the GC cycles, and
// the p99 and max of the GC's stop-the-world pauses and of the time
// goroutines (the consumer's, the publisher's, the in-process NATS
// server's) waited runnable before running.
type runtimeStats struct {
	cycles                   uint64
	pauses                   uint64
	pauseP99, pauseMax       time.Duration
	schedP99, schedP999, max time.Duration
}

// end returns what happened since w started.
func (w runtimeWindow) end() runtimeStats {
	now := readRuntime()
	var r runtimeStats
	if len(w.samples) == 0 {
		return r
	}
	r.cycles = now[2].Value.Uint64() - w.samples[2].Value.Uint64()
	pause := histDelta(w.samples[0].Value.Float64Histogram(), now[0].Value.Float64Histogram())
	sched := histDelta(w.samples[1].Value.Float64Histogram(), now[1].Value.Float64Histogram())
	r.pauses = pause.total()
	r.pauseP99, r.pauseMax = pause.quantile(0.99), pause.quantile(1)
	r.schedP99, r.schedP999, r.max = sched.quantile(0.99), sched.quantile(0.999), sched.quantile(1)
	return r
}

// hist is a runtime histogram's counts over a window.
type hist struct {
	counts  []uint64
	buckets []float64
}

func histDelta(a, b *metrics.Float64Histogram) hist {
	h := hist{counts: make([]uint64, len(b.Counts)), buckets: b.Buckets}
	for i := range b.Counts {
		h.counts[i] = b.Counts[i]
		if i < len(a.Counts) {
			h.counts[i] -= a.Counts[i]
		}
	}
	return h
}

func (h hist) total() uint64 {
	var n uint64
	for _, c := range h.counts {
		n += c
	}
	return n
}

// quantile returns the upper bound of the bucket holding quantile q (a
// bucket's lower bound where its upper one is infinite), 0 when empty.
func (h hist) quantile(q float64) time.Duration {
	n := h.total()
	if n == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(n)))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= max(want, 1) {
			hi := h.buckets[i+1]
			if math.IsInf(hi, 1) {
				hi = h.buckets[i]
			}
			return time.Duration(hi * float64(time.Second))
		}
	}
	return 0
}

// String is the phase's runtime line.
func (r runtimeStats) String() string {
	rd := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	return fmt.Sprintf("Go runtime during the phase: %d GC cycles, stop-the-world pauses p99 %v max %v; goroutines waiting to run p99 %v  p99.9 %v  max %v",
		r.cycles, rd(r.pauseP99), rd(r.pauseMax), rd(r.schedP99), rd(r.schedP999), rd(r.max))
}
