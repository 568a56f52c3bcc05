package powerfs_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/powerfs"
	"github.com/jetinbox/jetinbox/internal/testenv"
	_ "modernc.org/sqlite"
)

// SQLite runs in child processes (this test binary again): the writer must
// be able to die by SIGKILL with its files open, as in a power cut, while
// this process keeps serving the mount; and this process must not map the
// database's shared-memory file itself (see the package doc on mmap).
const sqliteEnv = "POWERFS_SQLITE_CHILD"

func TestMain(m *testing.M) {
	if spec := os.Getenv(sqliteEnv); spec != "" {
		if err := sqliteChild(spec); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// sqliteChild does one step, spec "step\tdsn\trows":
//   - create: create the table and close (closing the last connection
//     checkpoints into the database file and syncs it);
//   - write: commit rows one transaction each, printing each id once its
//     commit returned, then wait to be killed;
//   - count: print the rows the table has, after an integrity check.
func sqliteChild(spec string) error {
	parts := strings.Split(spec, "\t")
	if len(parts) != 3 {
		return fmt.Errorf("bad spec %q", spec)
	}
	rows, err := strconv.Atoi(parts[2])
	if err != nil {
		return err
	}
	db, err := sql.Open("sqlite", parts[1])
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(1)
	defer db.Close()
	switch parts[0] {
	case "create":
		_, err := db.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY)`)
		return err
	case "write":
		for i := 1; i <= rows; i++ {
			if _, err := db.Exec(`INSERT INTO t(id) VALUES (?)`, i); err != nil {
				return err
			}
			fmt.Println("committed", i)
		}
		fmt.Println("done")
		select {}
	case "count":
		var ok string
		if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil {
			return err
		}
		if ok != "ok" {
			return fmt.Errorf("integrity_check: %s", ok)
		}
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil {
			return err
		}
		fmt.Println("count", n)
		return nil
	}
	return fmt.Errorf("bad step %q", parts[0])
}

// runSQLite runs one step in a child and returns the numbers it printed
// after prefix, the last first; for the write step it returns at "done"
// and kills the child.
func runSQLite(t *testing.T, step, dsn string, rows int, prefix string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), sqliteEnv+"="+step+"\t"+dsn+"\t"+strconv.Itoa(rows))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	last := -1
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if line == "done" {
			return last
		}
		if n, ok := strings.CutPrefix(line, prefix+" "); ok {
			last, _ = strconv.Atoi(n)
			continue
		}
		t.Fatalf("sqlite %s: %s", step, line)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("sqlite %s: %v", step, err)
	}
	return last
}

func sqliteDSN(path, sync string) string {
	params := sqliteinbox.DSNParams() // the shipped settings: WAL, synchronous=FULL
	if sync != "FULL" {
		params = strings.Replace(params, "synchronous(FULL)", "synchronous("+sync+")", 1)
	}
	return "file:" + path + "?" + params
}

// sqliteCrash creates a table, lets a child commit rows and die by SIGKILL,
// crashes the filesystem, and returns how many rows were committed and
// how many the file still has.
func sqliteCrash(t *testing.T, sync string) (committed, kept int) {
	f := mount(t, powerfs.Options{})
	dsn := sqliteDSN(filepath.Join(f.Dir(), "db.sqlite"), sync)
	runSQLite(t, "create", dsn, 0, "")
	const rows = 200
	if committed = runSQLite(t, "write", dsn, rows, "committed"); committed != rows {
		t.Fatalf("the writer committed %d rows of %d", committed, rows)
	}
	crash(t, f, powerfs.CrashOptions{})
	kept = runSQLite(t, "count", dsn, 0, "count")
	t.Logf("synchronous=%s: %d rows committed, %d after the power cut", sync, committed, kept)
	return committed, kept
}

func TestSQLiteFullKeepsEveryCommit(t *testing.T) {
	if committed, kept := sqliteCrash(t, "FULL"); kept != committed {
		t.Fatalf("synchronous=FULL lost %d of %d committed rows", committed-kept, committed)
	}
}

// With synchronous=NORMAL a WAL commit is not synced; only a checkpoint
// syncs, and 200 one-row commits stay below the automatic checkpoint
// (1000 pages). So every commit since the table was made is unsynced.
func TestSQLiteNormalLosesCommits(t *testing.T) {
	if committed, kept := sqliteCrash(t, "NORMAL"); kept >= committed {
		t.Fatalf("synchronous=NORMAL kept all %d committed rows: the filesystem did not drop unsynced writes", committed)
	}
}

// startPostgres starts a durable cluster whose data directory is on a
// fresh mount.
func startPostgres(t *testing.T, settings ...string) (*powerfs.FS, *testenv.Postgres) {
	t.Helper()
	if _, err := testenv.FindPostgresBin(); errors.Is(err, testenv.ErrNoPostgres) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	f := mount(t, powerfs.Options{AllowOther: true}) // the server runs as the postgres user
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Dir: f.Dir(), Durable: true, MaxConnections: 20, Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Close() })
	return f, pg
}

// pgCrash commits rows one transaction each, cuts the power, and returns how
// many rows survive crash recovery.
//
// With awaitWritten it first commits more rows until the server has
// written WAL it has not flushed (with asynchronous commit the WAL writer
// writes full pages as they fill, on its own schedule): that part of the
// loss a kill alone would not cause.
func pgCrash(t *testing.T, f *powerfs.FS, pg *testenv.Postgres, rows int, awaitWritten bool) (committed, kept int, unsyncedWAL bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	// The table itself is committed synchronously whatever the setting
	// (in its own statements: a multi-statement query is one transaction,
	// which would commit under the setting the RESET restores).
	for _, q := range []string{`SET synchronous_commit = on`, `CREATE TABLE t (id int PRIMARY KEY)`, `RESET synchronous_commit`} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= rows; i++ {
		if _, err := c.Exec(ctx, `INSERT INTO t VALUES ($1)`, i); err != nil {
			t.Fatal(err)
		}
	}
	committed = rows
	for deadline := time.Now().Add(time.Minute); awaitWritten; committed++ {
		if err := c.QueryRow(ctx, `SELECT pg_current_wal_lsn() = pg_current_wal_flush_lsn()`).Scan(&awaitWritten); err != nil {
			t.Fatal(err)
		}
		if !awaitWritten {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server wrote no WAL beyond what it flushed in a minute")
		}
		if _, err := c.Exec(ctx, `INSERT INTO t VALUES ($1)`, committed+1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.Close(ctx)
	files, bytes := f.Unsynced()
	if err := pg.KillAll(); err != nil {
		t.Fatal(err)
	}
	// Every server process runs in the data directory: none may be left.
	if left := processesIn(f.Dir()); len(left) > 0 {
		t.Fatalf("after KillAll processes %v still run on the mount", left)
	}
	walWritten, walOnDisk := walViews(t, f)
	if walWritten == walOnDisk {
		t.Logf("the server had written no WAL that was not synced")
	} else {
		t.Logf("the server had written WAL that was not synced: a process crash would keep it, a power cut drops it")
	}
	st := crash(t, f, powerfs.CrashOptions{Tear: true, Seed: 1})
	t.Logf("unsynced before the cut: %d files, %d bytes", files, bytes)
	if err := pg.Start(ctx); err != nil {
		t.Fatalf("crash recovery after %s: %v", st, err)
	}
	c, err = pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if err := c.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rows committed, %d after the power cut and crash recovery", committed, kept)
	return committed, kept, walWritten != walOnDisk
}

// processesIn lists the live (not zombie) processes whose working
// directory is under dir.
func processesIn(dir string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil || !strings.HasPrefix(cwd, dir+"/") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if i := strings.LastIndexByte(string(b), ')'); err == nil && i >= 0 {
			if st := strings.Fields(string(b[i+1:])); len(st) > 0 && st[0] != "Z" && st[0] != "X" {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// walViews reads the WAL segments as the server left them (through the
// mount, which shows unsynced writes) and as the disk has them (the
// backing directory).
func walViews(t *testing.T, f *powerfs.FS) (written, onDisk string) {
	t.Helper()
	var segs []string
	err := filepath.WalkDir(f.Dir(), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && filepath.Base(filepath.Dir(p)) == "pg_wal" && len(d.Name()) == 24 {
			segs = append(segs, p)
		}
		return nil
	})
	if err != nil || len(segs) == 0 {
		t.Fatalf("no WAL segments under %s: %v", f.Dir(), err)
	}
	h1, h2 := sha256.New(), sha256.New()
	for _, p := range segs {
		rel, _ := filepath.Rel(f.Dir(), p)
		h1.Write(read(t, p))
		b, _ := os.ReadFile(filepath.Join(backings[f], rel)) // absent: never made durable
		h2.Write(b)
	}
	return string(h1.Sum(nil)), string(h2.Sum(nil))
}

func TestPostgresSynchronousCommitKeepsEveryCommit(t *testing.T) {
	f, pg := startPostgres(t)
	const rows = 300
	if committed, kept, _ := pgCrash(t, f, pg, rows, false); kept != committed {
		t.Fatalf("synchronous_commit=on lost %d of %d committed rows", committed-kept, committed)
	}
}

// With synchronous_commit off a commit returns before its WAL is flushed;
// the WAL writer writes full pages but flushes only every wal_writer_delay
// (or 1 MB), so the commits of the last seconds are unsynced when the
// power goes. Part of that loss (the WAL still in shared memory) a kill -9
// alone would cause; the test also checks that WAL the server had written
// was dropped, which only a power cut does.
func TestPostgresAsyncCommitLosesCommits(t *testing.T) {
	f, pg := startPostgres(t, "synchronous_commit=off", "wal_writer_delay=10s")
	const rows = 300
	committed, kept, unsyncedWAL := pgCrash(t, f, pg, rows, true)
	if kept >= committed {
		t.Fatalf("synchronous_commit=off kept all %d committed rows", committed)
	}
	// A kill alone loses the WAL still in the server's memory; the power
	// cut must also have dropped WAL the server had written.
	if !unsyncedWAL {
		t.Fatal("the WAL on disk equals what the server wrote: the filesystem kept unsynced writes")
	}
}
