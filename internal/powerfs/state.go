package powerfs

import (
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
)

// state is one mount's memory: pending file data by inode, and the files
// created since their name was last made durable. A Crash drops it whole.
type state struct {
	rootDev uint64

	mu    sync.Mutex
	files map[uint64]*file
	fresh map[uint64]uint64 // created file → its directory, until one of them is fsynced
}

func newState(rootDev uint64) *state {
	return &state{rootDev: rootDev, files: make(map[uint64]*file), fresh: make(map[uint64]uint64)}
}

// stable is the inode number go-fuse's loopback gives a backing file; it
// keys the state, so that every path and handle to one file share it.
func (s *state) stable(st *syscall.Stat_t) fs.StableAttr {
	swapped := (uint64(st.Dev) << 32) | (uint64(st.Dev) >> 32)
	swappedRoot := (s.rootDev << 32) | (s.rootDev >> 32)
	return fs.StableAttr{Mode: st.Mode, Ino: (swapped ^ swappedRoot) ^ st.Ino}
}

func (s *state) lookup(key uint64) *file {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.files[key]
}

// acquire returns the file's shared state for a new handle on fd.
func (s *state) acquire(key uint64, fd int) *file {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.files[key]
	if f == nil {
		var st syscall.Stat_t
		size := int64(0)
		if syscall.Fstat(fd, &st) == nil {
			size = st.Size
		}
		f = newFile(size)
		s.files[key] = f
	}
	f.refs++
	return f
}

// release drops a handle; the state goes once nothing is pending or the
// file has no name left.
func (s *state) release(key uint64, f *file) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refs--
	if f.refs > 0 || s.files[key] != f {
		return
	}
	gone := !f.dirty
	if !gone {
		var st syscall.Stat_t
		gone = syscall.Fstat(f.fd, &st) == nil && st.Nlink == 0
	}
	if gone {
		f.closeFd()
		delete(s.files, key)
	}
}

// unlinked forgets a file whose last name went.
func (s *state) unlinked(key uint64, last bool) {
	if !last {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.fresh, key)
	if f := s.files[key]; f != nil {
		f.mu.Lock()
		if f.refs == 0 {
			f.closeFd()
			delete(s.files, key)
		}
		f.mu.Unlock()
	}
}

func (s *state) created(key, dir uint64) {
	s.mu.Lock()
	s.fresh[key] = dir
	s.mu.Unlock()
}

func (s *state) moved(key, dir uint64) {
	s.mu.Lock()
	if _, ok := s.fresh[key]; ok {
		s.fresh[key] = dir
	}
	s.mu.Unlock()
}

func (s *state) fileSynced(key uint64) {
	s.mu.Lock()
	delete(s.fresh, key)
	s.mu.Unlock()
}

func (s *state) dirSynced(dir uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, d := range s.fresh {
		if d == dir {
			delete(s.fresh, k)
		}
	}
}

// unsynced sums what a crash now would drop.
func (s *state) unsynced() (files int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		f.mu.Lock()
		if n := f.unsynced(); n > 0 {
			files++
			bytes += n
		}
		f.mu.Unlock()
	}
	return files, bytes
}
