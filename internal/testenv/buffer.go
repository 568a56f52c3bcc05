package testenv

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that several writers (a logger's
// goroutines, a child's stdout and stderr) and the test reading it may
// share.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
