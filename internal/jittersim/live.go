package jittersim

import "time"

// Measure is the storm's measure applied to a live run: the requests a
// server saw at times, counted per bucket (10 ms in the storm), as a Row
// named name; Peak is the most that landed in one bucket.
func Measure(name string, times []time.Time, bucket time.Duration) Row {
	buckets := map[int64]int{}
	for _, t := range times {
		buckets[t.UnixNano()/int64(bucket)]++
	}
	return newRow(name, buckets)
}
