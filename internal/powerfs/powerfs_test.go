package powerfs_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/jetinbox/jetinbox/internal/powerfs"
)

// mount mounts a fresh filesystem for the test. Without FUSE it skips,
// except under CI, which must run these tests.
func mount(t *testing.T, o powerfs.Options) *powerfs.FS {
	t.Helper()
	dir := t.TempDir()
	if o.AllowOther {
		// Another user (postgres) must be able to walk to the mountpoint;
		// the test's temp dirs are 0700.
		for _, d := range []string{dir, filepath.Dir(dir)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	backing, mnt := filepath.Join(dir, "backing"), filepath.Join(dir, "mnt")
	for _, d := range []string{backing, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	f, err := powerfs.Mount(backing, mnt, o)
	backings[f] = backing
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no FUSE here: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	return f
}

// backings maps a test's mount to its backing directory.
var backings = map[*powerfs.FS]string{}

func crash(t *testing.T, f *powerfs.FS, o powerfs.CrashOptions) powerfs.CrashStats {
	t.Helper()
	st, err := f.Crash(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("crash: %s", st)
	return st
}

func read(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func write(t *testing.T, p string, flag int, data []byte, off int64, sync bool) {
	t.Helper()
	fh, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|flag, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := fh.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
}

func syncDir(t *testing.T, d string) {
	t.Helper()
	fh, err := os.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
}

// durable makes a synced file with the given content whose name is durable.
func durable(t *testing.T, f *powerfs.FS, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(f.Dir(), name)
	write(t, p, os.O_TRUNC, data, 0, true)
	syncDir(t, f.Dir())
	return p
}

func TestUnsyncedWriteIsLost(t *testing.T) {
	f := mount(t, powerfs.Options{})
	p := durable(t, f, "a", []byte("old content"))
	write(t, p, 0, []byte("NEW"), 0, false)
	if got := read(t, p); string(got) != "NEW content" {
		t.Fatalf("before the crash a reader sees %q, want the pending write", got)
	}
	if files, n := f.Unsynced(); files != 1 || n == 0 {
		t.Fatalf("Unsynced = %d files, %d bytes; want 1 file", files, n)
	}
	st := crash(t, f, powerfs.CrashOptions{})
	if st.Files != 1 {
		t.Errorf("crash dropped %d files, want 1", st.Files)
	}
	if got := read(t, p); string(got) != "old content" {
		t.Fatalf("after the crash: %q, want the synced %q", got, "old content")
	}
}

func TestSyncedWriteIsKept(t *testing.T) {
	f := mount(t, powerfs.Options{})
	p := durable(t, f, "a", []byte("first"))
	// Written through one descriptor, fdatasynced through another.
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("FIRST, and more"), 0); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fdatasync(int(r.Fd())); err != nil {
		t.Fatal(err)
	}
	r.Close()
	w.Close()
	// More after the sync is lost, the synced content stays.
	write(t, p, 0, []byte("lost"), 0, false)
	crash(t, f, powerfs.CrashOptions{})
	if got := read(t, p); string(got) != "FIRST, and more" {
		t.Fatalf("after the crash: %q, want the synced content", got)
	}
	if files, _ := f.Unsynced(); files != 0 {
		t.Fatalf("a fresh mount has %d unsynced files", files)
	}
}

func TestOSyncWritesAreKept(t *testing.T) {
	f := mount(t, powerfs.Options{})
	p := durable(t, f, "a", nil)
	write(t, p, os.O_SYNC, []byte("sync"), 0, false)
	write(t, p, syscall.O_DSYNC, []byte("dsync"), 4, false)
	write(t, p, 0, []byte("lost"), 0, false)
	crash(t, f, powerfs.CrashOptions{})
	if got := read(t, p); string(got) != "syncdsync" {
		t.Fatalf("after the crash: %q, want the O_SYNC and O_DSYNC writes %q", got, "syncdsync")
	}
}

func TestUnsyncedSizeChangesAreLost(t *testing.T) {
	f := mount(t, powerfs.Options{})
	data := bytes.Repeat([]byte("0123456789"), 1000) // 10000 bytes, three pages
	p := durable(t, f, "a", data)

	// Shrink, then grow again: the cut part reads as zeros until the crash.
	if err := os.Truncate(p, 5000); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := fh.Truncate(9000); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	got := read(t, p)
	want := append(append([]byte{}, data[:5000]...), make([]byte, 4000)...)
	if !bytes.Equal(got, want) {
		t.Fatalf("before the crash: %d bytes, zeros from 5000: %v", len(got), bytes.Equal(got[:5000], data[:5000]))
	}
	crash(t, f, powerfs.CrashOptions{})
	if got := read(t, p); !bytes.Equal(got, data) {
		t.Fatalf("after the crash: %d bytes, want the synced %d", len(got), len(data))
	}

	// An extension by a write past the end, and its stat, are pending too.
	write(t, p, 0, []byte("tail"), 20000, false)
	if fi, err := os.Stat(p); err != nil || fi.Size() != 20004 {
		t.Fatalf("stat before the crash: %v %v, want 20004 bytes", fi.Size(), err)
	}
	crash(t, f, powerfs.CrashOptions{})
	if fi, err := os.Stat(p); err != nil || fi.Size() != int64(len(data)) {
		t.Fatalf("stat after the crash: %v %v, want %d", fi.Size(), err, len(data))
	}
}

func TestCreatedFileNeedsASync(t *testing.T) {
	f := mount(t, powerfs.Options{})
	sub := filepath.Join(f.Dir(), "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	never := filepath.Join(sub, "never")
	byFile := filepath.Join(sub, "byfile")
	byDir := filepath.Join(f.Dir(), "bydir")
	renamed := filepath.Join(f.Dir(), "renamed")
	write(t, never, 0, []byte("x"), 0, false)
	write(t, byFile, 0, []byte("kept"), 0, true)
	write(t, byDir, 0, []byte("data lost, name kept"), 0, false)
	write(t, filepath.Join(sub, "moved"), 0, []byte("x"), 0, false)
	if err := os.Rename(filepath.Join(sub, "moved"), renamed); err != nil {
		t.Fatal(err)
	}
	syncDir(t, f.Dir()) // makes bydir's name durable, and renamed's: it now lives here
	st := crash(t, f, powerfs.CrashOptions{})
	if st.Entries != 1 {
		t.Errorf("crash removed %d entries, want 1", st.Entries)
	}
	if _, err := os.Stat(never); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a created, never synced file survived the crash: %v", err)
	}
	if got := read(t, byFile); string(got) != "kept" {
		t.Errorf("fsynced new file: %q", got)
	}
	if got := read(t, byDir); len(got) != 0 {
		t.Errorf("new file with a synced directory: %q, want empty (its data was never synced)", got)
	}
	if _, err := os.Stat(renamed); err != nil {
		t.Errorf("renamed into a synced directory: %v", err)
	}
}

func TestTearKeepsAPageAlignedPrefixOfTheLastWrite(t *testing.T) {
	f := mount(t, powerfs.Options{})
	old := bytes.Repeat([]byte{'o'}, 5*4096)
	p := durable(t, f, "a", old)
	fh, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// An earlier unsynced write, then the last one from page 1 into page 4.
	// (It starts on a page: the kernel splits a write at its first page
	// boundary when it starts inside a page, and the filesystem sees two.)
	if _, err := fh.WriteAt([]byte("earlier"), 0); err != nil {
		t.Fatal(err)
	}
	last := bytes.Repeat([]byte{'L'}, 3*4096+100)
	if _, err := fh.WriteAt(last, 4096); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	st := crash(t, f, powerfs.CrashOptions{Tear: true, Seed: 7})
	if !st.Torn {
		t.Fatal("the crash tore nothing")
	}
	got := read(t, p)
	if len(got) != len(old) {
		t.Fatalf("size %d, want %d", len(got), len(old))
	}
	if !bytes.Equal(got[:4096], old[:4096]) {
		t.Fatal("bytes before the last write changed: the earlier unsynced write reached the disk")
	}
	cut := 4096
	for cut < len(got) && got[cut] == 'L' {
		cut++
	}
	if cut%4096 != 0 || cut == 4096 || cut >= 4096+len(last) {
		t.Fatalf("the last write was cut at %d: want a page boundary strictly inside it", cut)
	}
	if !bytes.Equal(got[cut:], old[cut:]) {
		t.Fatalf("bytes after the cut at %d are not the old ones", cut)
	}
}

func TestCrashRefusesABusyMount(t *testing.T) {
	f := mount(t, powerfs.Options{})
	p := durable(t, f, "a", []byte("x"))
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Crash(powerfs.CrashOptions{}); !errors.Is(err, powerfs.ErrBusy) {
		t.Fatalf("Crash with an open file: %v, want ErrBusy", err)
	}
	fh.Close()
	crash(t, f, powerfs.CrashOptions{})
}

// O_APPEND offsets come from the kernel, which must see the pending size.
func TestAppendFollowsThePendingSize(t *testing.T) {
	f := mount(t, powerfs.Options{})
	p := durable(t, f, "log", []byte("synced;"))
	fh, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"one;", "two;"} {
		if _, err := fh.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	fh.Close()
	if got := read(t, p); string(got) != "synced;one;two;" {
		t.Fatalf("before the crash: %q", got)
	}
	crash(t, f, powerfs.CrashOptions{})
	if got := read(t, p); string(got) != "synced;" {
		t.Fatalf("after the crash: %q, want %q", got, "synced;")
	}
}
