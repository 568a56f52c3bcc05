package jittersim

// Mulberry32 is the mulberry32 generator, bit for bit as its usual JavaScript form (quoted on
// Float64) computes it, so that the retry storm's table can be checked with any implementation:
// that form's `|0`, `>>>` and Math.imul are 32-bit two's-complement operations, which uint32
// arithmetic reproduces (a product or sum that wraps in uint32 has the same low 32 bits as its
// int32 counterpart).
type Mulberry32 struct{ a uint32 }

// NewMulberry32 returns the generator seeded with seed.
func NewMulberry32(seed uint32) *Mulberry32 { return &Mulberry32{a: seed} }

// Float64 returns the next number in [0, 1), as the JavaScript closure does:
//
//	a = (a + 0x6d2b79f5) | 0
//	let t = Math.imul(a ^ (a >>> 15), 1 | a)
//	t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
//	return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32
func (m *Mulberry32) Float64() float64 {
	m.a += 0x6d2b79f5
	a := m.a
	t := (a ^ a>>15) * (1 | a)
	t = (t + (t^t>>7)*(61|t)) ^ t
	return float64(t^t>>14) / (1 << 32)
}
