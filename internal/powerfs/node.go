package powerfs

import (
	"context"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is a loopback node whose files keep their writes in memory until
// synced (see handle) and whose directories record which new entries an
// fsync made durable.
type node struct {
	fs.LoopbackNode
	st *state
}

func (n *node) key() uint64 { return n.StableAttr().Ino }

// backing is the node's path in the backing directory.
func (n *node) backing() string {
	return filepath.Join(n.RootData.Path, n.Path(n.RootData.RootNode.EmbeddedInode()))
}

// patch makes attributes read from the backing file show the pending size.
func (n *node) patch(a *fuse.Attr) {
	if f := n.st.lookup(n.key()); f != nil {
		f.mu.Lock()
		setSize(a, f.size)
		f.mu.Unlock()
	}
}

func setSize(a *fuse.Attr, size int64) {
	a.Size = uint64(size)
	a.Blocks = (uint64(size) + 511) / 512
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, e := n.LoopbackNode.Lookup(ctx, name, out)
	if e == 0 {
		if f := n.st.lookup(ch.StableAttr().Ino); f != nil {
			f.mu.Lock()
			setSize(&out.Attr, f.size)
			f.mu.Unlock()
		}
	}
	return ch, e
}

func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if h, ok := fh.(*handle); ok {
		return h.Getattr(ctx, out)
	}
	if e := n.LoopbackNode.Getattr(ctx, nil, out); e != 0 {
		return e
	}
	n.patch(&out.Attr)
	return 0
}

// Statx is answered from Getattr: the kernel asks for it on newer
// protocols, and the loopback's own would show the backing file's size.
func (n *node) Statx(ctx context.Context, fh fs.FileHandle, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	return syscall.ENOSYS
}

func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if h, ok := fh.(*handle); ok {
		return h.Setattr(ctx, in, out)
	}
	if sz, ok := in.GetSize(); ok {
		// truncate(2) by path: pending, like ftruncate.
		fd, err := syscall.Open(n.backing(), syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return errno(err)
		}
		f := n.st.acquire(n.key(), fd)
		f.mu.Lock()
		e := f.truncate(fd, int64(sz))
		f.mu.Unlock()
		n.st.release(n.key(), f)
		_ = syscall.Close(fd)
		if e != 0 {
			return e
		}
		in.Valid &^= fuse.FATTR_SIZE
	}
	if e := n.LoopbackNode.Setattr(ctx, nil, in, out); e != 0 {
		return e
	}
	n.patch(&out.Attr)
	return 0
}

// backingFlags is what the backing file is opened with: the sync flags
// are the handle's business (see handle.sync), O_TRUNC becomes a pending
// truncate, O_DIRECT would demand aligned buffers of our pwrites, and
// O_APPEND offsets come from the kernel.
func backingFlags(flags uint32) int {
	return int(flags)&^(syscall.O_APPEND|syscall.O_TRUNC|syscall.O_DSYNC|unix.O_SYNC|syscall.O_DIRECT|fuse.FMODE_EXEC) | syscall.O_CLOEXEC
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fd, err := syscall.Open(n.backing(), backingFlags(flags), 0)
	if err != nil {
		return nil, 0, errno(err)
	}
	h := n.newHandle(fd, flags)
	if flags&syscall.O_TRUNC != 0 {
		h.f.mu.Lock()
		e := h.f.truncate(fd, 0)
		h.f.mu.Unlock()
		if e != 0 {
			h.Release(ctx)
			return nil, 0, e
		}
	}
	return h, 0, 0
}

func (n *node) newHandle(fd int, flags uint32) *handle {
	f := n.st.acquire(n.key(), fd)
	return &handle{n: n, fd: fd, f: f, sync: flags&syscall.O_DSYNC != 0}
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	p := filepath.Join(n.backing(), name)
	fd, err := syscall.Open(p, backingFlags(flags)|syscall.O_CREAT|syscall.O_EXCL, mode)
	existed := err == syscall.EEXIST
	if existed {
		fd, err = syscall.Open(p, backingFlags(flags)|syscall.O_CREAT, mode)
	}
	if err != nil {
		return nil, nil, 0, errno(err)
	}
	if !existed {
		chownToCaller(ctx, p)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		_ = syscall.Close(fd)
		return nil, nil, 0, errno(err)
	}
	child := &node{LoopbackNode: fs.LoopbackNode{RootData: n.RootData}, st: n.st}
	ch := n.NewInode(ctx, child, n.st.stable(&st))
	if !existed {
		n.st.created(ch.StableAttr().Ino, n.key())
	}
	cn := ch.Operations().(*node)
	h := cn.newHandle(fd, flags)
	if existed && flags&syscall.O_TRUNC != 0 {
		h.f.mu.Lock()
		e := h.f.truncate(fd, 0)
		h.f.mu.Unlock()
		if e != 0 {
			h.Release(ctx)
			return nil, nil, 0, e
		}
	}
	out.FromStat(&st)
	cn.patch(&out.Attr)
	return ch, h, 0, 0
}

// chownToCaller gives a new entry to whoever made it, as the loopback does:
// we run as root, PostgreSQL as its own user.
func chownToCaller(ctx context.Context, p string) {
	if os.Getuid() != 0 {
		return
	}
	if c, ok := fuse.FromContext(ctx); ok {
		_ = syscall.Lchown(p, int(c.Uid), int(c.Gid))
	}
}

// Tmpfile is refused: a file without a name would escape the model.
func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	var st syscall.Stat_t
	p := filepath.Join(n.backing(), name)
	statErr := syscall.Lstat(p, &st)
	if e := n.LoopbackNode.Unlink(ctx, name); e != 0 {
		return e
	}
	if statErr == nil {
		n.st.unlinked(n.st.stable(&st).Ino, st.Nlink <= 1)
	}
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	var st, old syscall.Stat_t
	statErr := syscall.Lstat(filepath.Join(n.backing(), name), &st)
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	target := filepath.Join(np.backing(), newName)
	oldErr := syscall.Lstat(target, &old)
	if e := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags); e != 0 {
		return e
	}
	if statErr == nil {
		n.st.moved(n.st.stable(&st).Ino, np.key())
	}
	if oldErr == nil && flags&unix.RENAME_EXCHANGE == 0 {
		n.st.unlinked(n.st.stable(&old).Ino, old.Nlink <= 1)
	}
	return 0
}

// Fsync on a directory (when the kernel sends it to the node) makes its new
// entries durable.
func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := fh.(*handle); ok {
		return h.Fsync(ctx, flags)
	}
	n.st.dirSynced(n.key())
	return 0
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ds, e := fs.NewLoopbackDirStream(n.backing())
	if e != 0 {
		return nil, 0, e
	}
	ld, ok := ds.(loopDir)
	if !ok {
		ds.Close()
		return nil, 0, syscall.ENOTSUP
	}
	return &dirHandle{loopDir: ld, n: n}, 0, 0
}

type loopDir interface {
	fs.FileReaddirenter
	fs.FileSeekdirer
	fs.FileReleasedirer
}

// dirHandle is the loopback's directory stream with an fsync that counts.
type dirHandle struct {
	loopDir
	n *node
}

// Fsyncdir makes the entries created in this directory durable.
func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	d.n.st.dirSynced(d.n.key())
	return 0
}

// CopyFileRange is refused, so the kernel copies through Read and Write.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, l uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.EOPNOTSUPP
}
