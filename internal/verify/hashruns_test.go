package verify

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestHashRuns: the chain check's set of stream IDs answers like a map
// whatever the chunk sizes, and holds about 8 bytes a hash.
func TestHashRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var s hashRuns
	want := map[uint64]bool{}
	for range 300 {
		var chunk []uint64
		for range rng.IntN(500) {
			h := rng.Uint64() >> 40 // small range: later chunks meet earlier hashes
			if want[h] || s.has(h) {
				if !want[h] {
					t.Fatalf("%x: in the set, never added", h)
				}
				continue
			}
			if contains(chunk, h) {
				continue
			}
			chunk = append(chunk, h)
		}
		s.add(chunk)
		for _, h := range chunk {
			want[h] = true
		}
	}
	for h := range want {
		if !s.has(h) {
			t.Fatalf("%x: added, not in the set", h)
		}
	}
	for range 10000 {
		if h := rng.Uint64() >> 40; s.has(h) != want[h] {
			t.Fatalf("%x: has %v, want %v", h, s.has(h), want[h])
		}
	}
	for i := 1; i < len(s.runs); i++ {
		if len(s.runs[i]) > len(s.runs[i-1]) {
			t.Fatalf("run %d (%d) is longer than run %d (%d)", i, len(s.runs[i]), i-1, len(s.runs[i-1]))
		}
	}

	// Memory: a million hashes in chunks of 10,000.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var big hashRuns
	for range 100 {
		chunk := make([]uint64, 10000)
		for i := range chunk {
			chunk[i] = rng.Uint64()
		}
		big.add(chunk)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perID := float64(after.HeapAlloc-before.HeapAlloc) / 1e6
	t.Logf("%.1f bytes a hash in %d runs", perID, len(big.runs))
	if perID > 16 {
		t.Errorf("%.1f bytes a hash, want about 8", perID)
	}
}

func contains(s []uint64, h uint64) bool {
	for _, x := range s {
		if x == h {
			return true
		}
	}
	return false
}
