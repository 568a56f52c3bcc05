package powerfs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// handle is an open file. Its data goes to the shared pending state, never
// straight to the backing file. It deliberately has no PassthroughFd: with
// one, go-fuse would let the kernel write to the backing file directly.
type handle struct {
	n    *node
	fd   int
	f    *file
	sync bool // opened O_SYNC or O_DSYNC: every write is followed by a data sync
}

var (
	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileFsyncer   = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileGetattrer = (*handle)(nil)
	_ fs.FileSetattrer = (*handle)(nil)
	_ fs.FileLseeker   = (*handle)(nil)
	_ fs.FileAllocater = (*handle)(nil)
)

func (h *handle) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	n, e := h.f.read(h.fd, buf, off)
	if e != 0 {
		return nil, e
	}
	return fuse.ReadResultData(buf[:n]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if e := h.f.write(h.fd, data, off); e != 0 {
		return 0, e
	}
	if h.sync {
		if e := h.f.sync(); e != 0 {
			return 0, e
		}
	}
	return uint32(len(data)), 0
}

// Fsync writes the file's pending data out, whichever handle wrote it
// (fsync and fdatasync alike), and makes its name durable if it was new.
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	h.f.mu.Lock()
	e := h.f.sync()
	h.f.mu.Unlock()
	if e != 0 {
		return e
	}
	h.n.st.fileSynced(h.n.key())
	return 0
}

// Flush (close(2)) syncs nothing.
func (h *handle) Flush(ctx context.Context) syscall.Errno { return 0 }

func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.n.st.release(h.n.key(), h.f)
	err := syscall.Close(h.fd)
	return errno0(err)
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(h.fd, &st); err != nil {
		return errno(err)
	}
	out.FromStat(&st)
	h.f.mu.Lock()
	setSize(&out.Attr, h.f.size)
	h.f.mu.Unlock()
	return 0
}

func (h *handle) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if m, ok := in.GetMode(); ok {
		if err := syscall.Fchmod(h.fd, m); err != nil {
			return errno(err)
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		if err := syscall.Fchown(h.fd, u, g); err != nil {
			return errno(err)
		}
	}
	if sz, ok := in.GetSize(); ok {
		h.f.mu.Lock()
		e := h.f.truncate(h.fd, int64(sz))
		h.f.mu.Unlock()
		if e != 0 {
			return e
		}
	}
	mt, mok := in.GetMTime()
	at, aok := in.GetATime()
	if mok || aok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if aok {
			ts[0] = unix.NsecToTimespec(at.UnixNano())
		}
		if mok {
			ts[1] = unix.NsecToTimespec(mt.UnixNano())
		}
		if err := unix.UtimesNanoAt(h.fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
			return errno(err)
		}
	}
	return h.Getattr(ctx, out)
}

// Lseek answers SEEK_DATA and SEEK_HOLE as if the file had no holes; the
// kernel does the other whences itself from the size Getattr reports.
func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	h.f.mu.Lock()
	size := uint64(h.f.size)
	h.f.mu.Unlock()
	switch whence {
	case unix.SEEK_DATA:
		if off >= size {
			return 0, syscall.ENXIO
		}
		return off, 0
	case unix.SEEK_HOLE:
		if off >= size {
			return 0, syscall.ENXIO
		}
		return size, 0
	}
	return 0, syscall.EINVAL
}

// Allocate supports plain preallocation as a pending extension; callers
// such as posix_fallocate fall back to writing zeros on anything else.
func (h *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if mode != 0 {
		return syscall.EOPNOTSUPP
	}
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if end := int64(off + size); end > h.f.size {
		return h.f.truncate(h.fd, end)
	}
	return 0
}

func errno0(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return errno(err)
}
