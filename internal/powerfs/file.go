package powerfs

import (
	"math"
	"sort"
	"strconv"
	"sync"
	"syscall"
)

const pageSize = 4096

// file is what a crash would lose of one backing file: its dirty pages and
// its pending size. Every handle on the same backing inode shares it, so a
// write through one descriptor and an fsync through another behave as on a
// real filesystem.
type file struct {
	mu   sync.Mutex
	fd   int // a writable descriptor on the backing file, -1 while clean
	refs int // open handles

	pages    map[int64]*[pageSize]byte // dirty pages, whole, merged over the backing data
	size     int64                     // the size readers see
	baseSize int64                     // the backing file's size, i.e. what is durable
	zeroFrom int64                     // backing bytes at or past this offset read as zeros (a pending shrink)
	dirty    bool

	lastOff  int64 // the last unsynced write, for a torn crash
	lastData []byte
}

func newFile(size int64) *file {
	return &file{fd: -1, size: size, baseSize: size, zeroFrom: math.MaxInt64}
}

// ensureFd keeps a descriptor of its own so that an fsync through any handle,
// even a read-only one, can write the pending pages out.
func (f *file) ensureFd(src int) syscall.Errno {
	if f.fd >= 0 {
		return 0
	}
	// Reopened read-write rather than dup'ed: the handle that first writes
	// may be write-only (a truncate by path) and reads need the same fd.
	fd, err := syscall.Open("/proc/self/fd/"+strconv.Itoa(src), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return errno(err)
	}
	f.fd = fd
	return 0
}

// limit is where the durable data ends for readers: past it, bytes are zero.
func (f *file) limit() int64 { return min(f.baseSize, f.zeroFrom) }

// readBacking fills buf from the backing file at off, zeros past limit.
func (f *file) readBacking(fd int, buf []byte, off int64) syscall.Errno {
	lim := f.limit()
	n := 0
	if off < lim {
		want := int(min(int64(len(buf)), lim-off))
		for n < want {
			m, err := syscall.Pread(fd, buf[n:want], off+int64(n))
			if err != nil {
				return errno(err)
			}
			if m == 0 {
				break
			}
			n += m
		}
	}
	clear(buf[n:])
	return 0
}

func (f *file) page(fd int, p int64) (*[pageSize]byte, syscall.Errno) {
	if pg, ok := f.pages[p]; ok {
		return pg, 0
	}
	pg := new([pageSize]byte)
	if e := f.readBacking(fd, pg[:], p*pageSize); e != 0 {
		return nil, e
	}
	if f.pages == nil {
		f.pages = make(map[int64]*[pageSize]byte)
	}
	f.pages[p] = pg
	return pg, 0
}

// write keeps data at off in memory only.
func (f *file) write(src int, data []byte, off int64) syscall.Errno {
	if e := f.ensureFd(src); e != 0 {
		return e
	}
	for done := 0; done < len(data); {
		at := off + int64(done)
		pg, e := f.page(f.fd, at/pageSize)
		if e != 0 {
			return e
		}
		done += copy(pg[at%pageSize:], data[done:])
	}
	f.size = max(f.size, off+int64(len(data)))
	f.lastOff = off
	f.lastData = append(f.lastData[:0], data...)
	f.dirty = true
	return 0
}

// read serves the pending state merged over the backing file.
func (f *file) read(fd int, buf []byte, off int64) (int, syscall.Errno) {
	if f.fd >= 0 {
		fd = f.fd
	}
	if off >= f.size {
		return 0, 0
	}
	buf = buf[:min(int64(len(buf)), f.size-off)]
	if len(f.pages) == 0 {
		return len(buf), f.readBacking(fd, buf, off)
	}
	// Runs of clean pages are read from the backing file in one call.
	runStart := -1
	flush := func(end int) syscall.Errno {
		if runStart < 0 {
			return 0
		}
		e := f.readBacking(fd, buf[runStart:end], off+int64(runStart))
		runStart = -1
		return e
	}
	for i := 0; i < len(buf); {
		at := off + int64(i)
		n := int(min(int64(len(buf)-i), pageSize-at%pageSize))
		if pg, ok := f.pages[at/pageSize]; ok {
			if e := flush(i); e != 0 {
				return 0, e
			}
			copy(buf[i:i+n], pg[at%pageSize:])
		} else if runStart < 0 {
			runStart = i
		}
		i += n
	}
	return len(buf), flush(len(buf))
}

// truncate sets the pending size.
func (f *file) truncate(src int, size int64) syscall.Errno {
	if e := f.ensureFd(src); e != 0 {
		return e
	}
	if size < f.size {
		for p := range f.pages {
			if p*pageSize >= size {
				delete(f.pages, p)
			}
		}
		if pg, ok := f.pages[size/pageSize]; ok {
			clear(pg[size%pageSize:])
		}
		f.zeroFrom = min(f.zeroFrom, size)
	}
	f.size = size
	f.lastData = f.lastData[:0] // a write cut short by a truncate is no longer the last on disk
	f.dirty = true
	return 0
}

// sync writes the pending state to the backing file. The backing directory
// never loses power, so a write reaching it is durable; it is not fsynced.
func (f *file) sync() syscall.Errno {
	if !f.dirty {
		return 0
	}
	if f.zeroFrom < f.baseSize {
		if err := syscall.Ftruncate(f.fd, f.zeroFrom); err != nil {
			return errno(err)
		}
	}
	keys := make([]int64, 0, len(f.pages))
	for p := range f.pages {
		keys = append(keys, p)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	for _, p := range keys {
		start := p * pageSize
		end := min(start+pageSize, f.size)
		if end <= start {
			continue
		}
		if _, err := syscall.Pwrite(f.fd, f.pages[p][:end-start], start); err != nil {
			return errno(err)
		}
	}
	if err := syscall.Ftruncate(f.fd, f.size); err != nil {
		return errno(err)
	}
	f.pages = nil
	f.baseSize = f.size
	f.zeroFrom = math.MaxInt64
	f.lastData = nil
	f.dirty = false
	f.closeFd()
	return 0
}

// unsynced is how many bytes a crash now would drop.
func (f *file) unsynced() int64 {
	if !f.dirty {
		return 0
	}
	n := int64(len(f.pages)) * pageSize
	if n == 0 {
		n = max(f.size-f.baseSize, f.baseSize-f.size, 1)
	}
	return n
}

// tornBoundaries are the page boundaries strictly inside the last write:
// the points where a crash can cut it.
func (f *file) tornBoundaries() []int64 {
	var out []int64
	end := f.lastOff + int64(len(f.lastData))
	for b := (f.lastOff/pageSize + 1) * pageSize; b < end; b += pageSize {
		out = append(out, b)
	}
	return out
}

// tear writes the last write's bytes before cut to the backing file, as if
// the disk had taken them before the power went.
func (f *file) tear(cut int64) error {
	_, err := syscall.Pwrite(f.fd, f.lastData[:cut-f.lastOff], f.lastOff)
	return err
}

func (f *file) closeFd() {
	if f.fd >= 0 {
		_ = syscall.Close(f.fd)
		f.fd = -1
	}
}

func errno(err error) syscall.Errno {
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}
