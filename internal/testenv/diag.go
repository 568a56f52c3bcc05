package testenv

import (
	"bytes"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// LogTail is an io.Writer that keeps the last lines written to it, for a
// test to print when it fails: a stall is understood from what the
// components logged just before, not from the whole run.
type LogTail struct {
	mu    sync.Mutex
	max   int
	lines []string
	part  []byte
}

// NewLogTail keeps the last max lines.
func NewLogTail(max int) *LogTail { return &LogTail{max: max} }

// Write keeps the complete lines of p (and the start of an incomplete one).
func (l *LogTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.part = append(l.part, p...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, string(l.part[:i]))
		l.part = l.part[i+1:]
	}
	if over := len(l.lines) - l.max; over > 0 {
		l.lines = append(l.lines[:0], l.lines[over:]...)
	}
	return len(p), nil
}

// String returns the kept lines.
func (l *LogTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// LogGoroutines logs the stacks of the goroutines whose stack mentions
// substr (a package path, say): where a stalled component waits.
func LogGoroutines(t testing.TB, substr string) {
	t.Helper()
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, substr) {
			out = append(out, g)
		}
	}
	t.Logf("%d goroutines in %s:\n%s", len(out), substr, strings.Join(out, "\n\n"))
}
