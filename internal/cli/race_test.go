//go:build race

package cli

// raceEnabled reports whether the race detector is on: it multiplies a
// process's resident memory, so RSS limits do not hold under it.
const raceEnabled = true
