// Package powerfs is a filesystem for tests that loses, on a simulated power
// cut, what was never synced: the model of Jepsen's LazyFS, on FUSE.
//
// A mount passes everything through to a backing directory except file data.
// Every write, and every size change (ftruncate, truncate, an extension by a
// write or by fallocate), stays in memory until the file is synced: fsync
// or fdatasync on any descriptor of the file, or a write through a
// descriptor opened O_SYNC or O_DSYNC. Reads see the pending writes merged
// over the backing file. A sync writes the file's pending pages to the
// backing file; the backing directory itself never loses power, so nothing
// there is fsynced. [FS.Crash] drops everything unsynced, optionally tearing
// the last unsynced write of one file at a page boundary, and mounts again,
// so the mount serves only what was synced.
//
// Directory entries: a file created through the mount whose name was never
// made durable (neither the file nor its directory fsynced since it was
// created) is removed at a crash. Every other change to the tree is written
// through at once and survives a crash: renames, unlinks, mkdir, rmdir,
// links, symlinks, device nodes. So a rename that replaced a file survives
// even if its directory was never fsynced; that is the lenient side, and
// tests that need an unsynced rename to be lost cannot use this.
//
// Not modelled either:
//   - sync_file_range never reaches a FUSE daemon, so data "synced" only
//     with it is treated as unsynced (the strict side);
//   - metadata: mode, ownership, times and extended attributes are written
//     through;
//   - the kernel's page cache plays no part: Crash unmounts, so no cached page
//     outlives it, and every process that used the mount must already be dead;
//   - O_TMPFILE is refused, and copy_file_range falls back to read and write.
//
// The process that mounts serves the filesystem with goroutines, so it must
// not itself touch a file on the mount through mmap (SQLite's -shm file
// is one): a page fault there blocks its thread in a way the Go runtime
// cannot preempt, a stop-the-world then waits forever, and the serving
// goroutines never answer the fault. Run such users in another process;
// plain read and write calls from the mounting process are fine.
package powerfs

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Options configures a mount.
type Options struct {
	// AllowOther lets users other than the mounting one use the mount
	// (PostgreSQL runs as the postgres user).
	AllowOther bool
	// Logf, if set, receives what the filesystem does on Mount and Crash.
	Logf func(format string, a ...any)
}

// FS is a mounted power-loss filesystem.
type FS struct {
	backing, mnt string
	opts         Options

	mu     sync.Mutex
	server *fuse.Server
	st     *state
}

// Mount mounts a filesystem at mountpoint passing through to backing. Both
// directories must exist. It needs root (or CAP_SYS_ADMIN) and /dev/fuse.
func Mount(backing, mountpoint string, o Options) (*FS, error) {
	b, err := filepath.Abs(backing)
	if err != nil {
		return nil, fmt.Errorf("powerfs: %w", err)
	}
	m, err := filepath.Abs(mountpoint)
	if err != nil {
		return nil, fmt.Errorf("powerfs: %w", err)
	}
	for _, d := range []string{b, m} {
		if fi, err := os.Stat(d); err != nil {
			return nil, fmt.Errorf("powerfs: %w", err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("powerfs: %s is not a directory", d)
		}
	}
	f := &FS{backing: b, mnt: m, opts: o}
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *FS) logf(format string, a ...any) {
	if f.opts.Logf != nil {
		f.opts.Logf(format, a...)
	}
}

func (f *FS) mount() error {
	var st syscall.Stat_t
	if err := syscall.Stat(f.backing, &st); err != nil {
		return fmt.Errorf("powerfs: %w", err)
	}
	s := newState(uint64(st.Dev))
	root := &gofs.LoopbackRoot{Path: f.backing, Dev: uint64(st.Dev)}
	root.NewNode = func(r *gofs.LoopbackRoot, _ *gofs.Inode, _ string, _ *syscall.Stat_t) gofs.InodeEmbedder {
		return &node{LoopbackNode: gofs.LoopbackNode{RootData: r}, st: s}
	}
	rootNode := root.NewNode(root, nil, "", &st)
	root.RootNode = rootNode
	// Nothing cached in the kernel may hide a pending size from a stat.
	var zero time.Duration
	server, err := gofs.Mount(f.mnt, rootNode, &gofs.Options{
		MountOptions: fuse.MountOptions{
			DirectMount: true,
			AllowOther:  f.opts.AllowOther,
			FsName:      f.backing,
			Name:        "powerfs",
			// Requests of one process run concurrently, as on a disk.
			MaxBackground: 64,
		},
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
	})
	if err != nil {
		return fmt.Errorf("powerfs: mount %s (needs root or CAP_SYS_ADMIN and /dev/fuse; without either, go-fuse falls back to fusermount3 from the fuse3 package): %w", f.mnt, err)
	}
	f.server, f.st = server, s
	f.logf("powerfs: mounted %s on %s", f.backing, f.mnt)
	return nil
}

// Dir is the mountpoint.
func (f *FS) Dir() string { return f.mnt }

// Unsynced reports what a crash now would drop: files with pending data or
// size, and the bytes of their dirty pages.
func (f *FS) Unsynced() (files int, bytes int64) {
	f.mu.Lock()
	s := f.st
	f.mu.Unlock()
	if s == nil {
		return 0, 0
	}
	return s.unsynced()
}

// CrashOptions shapes a crash.
type CrashOptions struct {
	// Tear lets a page-aligned prefix of the last unsynced write of one
	// file (chosen with Seed among those whose last write crosses a page
	// boundary) reach the disk; the rest of it is lost with everything else.
	// A write is what the kernel hands over: it splits a write(2) that
	// starts inside a page at that page's end.
	Tear bool
	Seed int64
}

// CrashStats is what a crash dropped.
type CrashStats struct {
	Files   int   // files whose pending data or size was dropped
	Bytes   int64 // bytes of dirty pages dropped
	Entries int   // created files removed because their name was never made durable
	Torn    bool  // a write was torn
}

func (c CrashStats) String() string {
	s := fmt.Sprintf("dropped %d bytes in %d files, removed %d unsynced entries", c.Bytes, c.Files, c.Entries)
	if c.Torn {
		s += ", tore one write"
	}
	return s
}

// ErrBusy is returned by Crash and Close while a process still uses the mount.
var ErrBusy = errors.New("powerfs: mount is busy: kill every process using it first")

// Crash simulates a power cut: it unmounts, drops every unsynced write and
// size change and every created file whose name was never made durable, and
// mounts again on the same mountpoint. Every process that used the mount
// must already be dead; if the mount is busy it returns an error wrapping
// ErrBusy and changes nothing.
func (f *FS) Crash(o CrashOptions) (CrashStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.server == nil {
		return CrashStats{}, errors.New("powerfs: not mounted")
	}
	if err := f.unmount(); err != nil {
		return CrashStats{}, err
	}
	s := f.st
	f.server, f.st = nil, nil
	stats, err := s.crash(f.backing, o)
	if err != nil {
		return stats, fmt.Errorf("powerfs: crash: %w", err)
	}
	f.logf("powerfs: crash on %s: %s", f.mnt, stats)
	return stats, f.mount()
}

func (f *FS) unmount() error {
	var err error
	// The kernel may still be finishing a dead process's close; give it
	// a moment before calling the mount busy.
	for i := 0; i < 50; i++ {
		if err = syscall.Unmount(f.mnt, 0); err == nil {
			f.server.Wait()
			return nil
		}
		if err != syscall.EBUSY {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err == syscall.EBUSY {
		return fmt.Errorf("%w: %s", ErrBusy, f.mnt)
	}
	// Mounted by fusermount3 (not as root): unmount the same way.
	if err := f.server.Unmount(); err != nil {
		return fmt.Errorf("powerfs: unmount %s: %w", f.mnt, err)
	}
	return nil
}

// crash drops the state after an unmount, leaving on the backing directory
// only what was synced (and a torn prefix, if asked).
func (s *state) crash(backing string, o CrashOptions) (CrashStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var stats CrashStats
	keys := make([]uint64, 0, len(s.files))
	for k, f := range s.files {
		if n := f.unsynced(); n > 0 {
			stats.Files++
			stats.Bytes += n
		}
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	if o.Tear {
		var torn []uint64
		for _, k := range keys {
			if f := s.files[k]; f.dirty && len(f.tornBoundaries()) > 0 {
				torn = append(torn, k)
			}
		}
		if len(torn) > 0 {
			rng := rand.New(rand.NewPCG(uint64(o.Seed), 0x706f776572))
			f := s.files[torn[rng.IntN(len(torn))]]
			b := f.tornBoundaries()
			if err := f.tear(b[rng.IntN(len(b))]); err != nil {
				return stats, err
			}
			stats.Torn = true
		}
	}
	for _, k := range keys {
		s.files[k].closeFd()
	}
	s.files = nil
	if len(s.fresh) > 0 {
		err := filepath.WalkDir(backing, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			var st syscall.Stat_t
			if syscall.Lstat(p, &st) != nil {
				return nil
			}
			if _, ok := s.fresh[s.stable(&st).Ino]; ok {
				if err := os.Remove(p); err != nil {
					return err
				}
				stats.Entries++
			}
			return nil
		})
		if err != nil {
			return stats, err
		}
	}
	s.fresh = nil
	return stats, nil
}

// Close unmounts, syncing nothing: what is pending is lost, as in a crash,
// except that created files keep their names. If a process still uses the
// mount, Close aborts the connection (its calls fail from then on) and
// returns an error wrapping ErrBusy: a test that serves the mount itself
// would otherwise hang on exit closing its own open files.
func (f *FS) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.server == nil {
		return nil
	}
	err := f.unmount()
	if errors.Is(err, ErrBusy) {
		if ferr := syscall.Unmount(f.mnt, syscall.MNT_FORCE|syscall.MNT_DETACH); ferr != nil {
			return fmt.Errorf("%w; forced unmount: %w", err, ferr)
		}
		f.server.Wait()
	} else if err != nil {
		return err
	}
	for _, file := range f.st.files {
		file.closeFd()
	}
	f.server, f.st = nil, nil
	return err
}
