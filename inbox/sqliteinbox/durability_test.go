package sqliteinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/storetest"
)

// TestOpenSettings: Open gives the settings the guarantee rests on, and
// CheckSettings refuses a connection without them.
func TestOpenSettings(t *testing.T) {
	ctx := context.Background()
	_, db := newFile(t)
	var mode string
	var syncLevel, busy int
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("PRAGMA synchronous").Scan(&syncLevel); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("PRAGMA busy_timeout").Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" || syncLevel != 2 || busy != int(sqliteinbox.BusyTimeout.Milliseconds()) {
		t.Fatalf("journal_mode %s, synchronous %d, busy_timeout %d; want wal, 2 (FULL), %d", mode, syncLevel, busy, sqliteinbox.BusyTimeout.Milliseconds())
	}
	for _, bad := range []string{
		"_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate",
		"_pragma=busy_timeout(5000)&_pragma=journal_mode(DELETE)&_pragma=synchronous(FULL)&_txlock=immediate",
		"_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate",
		"_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)",
	} {
		other, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "other.db")+"?"+bad)
		if err != nil {
			t.Fatal(err)
		}
		other.SetMaxOpenConns(1)
		err = sqliteinbox.CheckSettings(ctx, other)
		other.Close()
		if !errors.Is(err, sqliteinbox.ErrUnsafeSettings) {
			t.Errorf("%s: %v, want ErrUnsafeSettings", bad, err)
		}
	}
	if _, err := sqliteinbox.Open(ctx, ":memory:"); err == nil {
		t.Error("an in-memory database was accepted")
	}
}

// The helper process: a consumer on the file in JETINBOX_SQLITE_CHILD.
// Mode "race" claims the intents of the shared list again and again in
// random batches until each is applied; mode "commit-crash" processes one
// batch and kills itself with SIGKILL right after its COMMIT.
func TestMain(m *testing.M) {
	if path := os.Getenv("JETINBOX_SQLITE_CHILD"); path != "" {
		if err := child(path, os.Getenv("JETINBOX_SQLITE_MODE")); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// raceIntents are the intents both child processes apply.
func raceIntents() []inbox.Message {
	msgs := make([]inbox.Message, 600)
	for i := range msgs {
		msgs[i] = storetest.Intent(fmt.Sprintf("r%04d", i), int64(1+i%11), int64(1+i%101))
	}
	return msgs
}

// crashBatch is the batch the commit-crash child commits before it dies.
func crashBatch() []inbox.Message {
	return []inbox.Message{storetest.Intent("cc-1", 1, 10), storetest.Intent("cc-2", 2, 20), storetest.Intent("cc-3", 1, 30)}
}

func child(path, mode string) error {
	ctx := context.Background()
	db, err := sqliteinbox.Open(ctx, path)
	if err != nil {
		return err
	}
	p, err := inbox.NewProcessor(sqliteinbox.New(db), effects.NewSQLiteLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		return err
	}
	switch mode {
	case "commit-crash":
		fp := failpoint.New()
		fp.Enable(failpoint.AfterCommit, 1)
		fp.Attach(p)
		_, err := p.Process(ctx, crashBatch())
		if errors.Is(err, inbox.ErrOutcomeUnknown) && failpoint.IsCrash(err) {
			// The process dies between COMMIT and ack.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return fmt.Errorf("the crash point did not fire: %v", err)
	case "race":
		left := raceIntents()
		for len(left) > 0 {
			rand.Shuffle(len(left), func(i, j int) { left[i], left[j] = left[j], left[i] })
			n := min(len(left), 1+rand.IntN(40))
			out, err := p.Process(ctx, left[:n])
			if err != nil {
				continue // retried below with the rest
			}
			var again []inbox.Message
			for i, o := range out {
				switch {
				case o.Ackable():
				case o.Status == inbox.StatusRetry:
					again = append(again, left[i])
				default:
					return fmt.Errorf("%s: %v %s", left[i].ID, o.Status, o.Reason)
				}
			}
			left = append(again, left[n:]...)
		}
		return nil
	}
	return fmt.Errorf("unknown mode %q", mode)
}

func startChild(t *testing.T, path, mode string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "JETINBOX_SQLITE_CHILD="+path, "JETINBOX_SQLITE_MODE="+mode)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TestTwoProcessesKill9: two processes apply the same intents to one file
// at once, and are killed with SIGKILL at random moments and restarted, as
// a supervisor would; every intent ends applied exactly once.
func TestTwoProcessesKill9(t *testing.T) {
	path, db := newFile(t)
	deadline := time.Now().Add(2 * time.Minute)
	kills := 0
	type proc struct {
		cmd  *exec.Cmd
		done chan error
	}
	start := func() *proc {
		p := &proc{cmd: startChild(t, path, "race"), done: make(chan error, 1)}
		go func() { p.done <- p.cmd.Wait() }()
		return p
	}
	procs := []*proc{start(), start()}
	finished := make([]bool, len(procs))
	for n := 0; ; n++ {
		all := true
		for i, p := range procs {
			if finished[i] {
				continue
			}
			select {
			case err := <-p.done:
				var exit *exec.ExitError
				if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signaled() {
					procs[i] = start() // killed: restart
					all = false
					continue
				}
				if err != nil {
					t.Fatalf("process %d: %v", i, err)
				}
				finished[i] = true
				continue
			default:
			}
			all = false
			if n < 12 && rand.IntN(2) == 0 {
				_ = p.cmd.Process.Kill() // SIGKILL, mid-batch or not
				kills++
			}
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			for _, p := range procs {
				_ = p.cmd.Process.Kill()
			}
			t.Fatal("the processes did not finish in 2 minutes")
		}
		time.Sleep(time.Duration(30+rand.IntN(120)) * time.Millisecond)
	}
	want := map[string]inbox.Message{}
	for _, m := range raceIntents() {
		want[m.ID] = m
	}
	if v := storetest.Violations(t, snapshot(t, db), want); len(v) > 0 {
		t.Fatalf("after %d kills, invariants broken:\n%s", kills, strings.Join(v, "\n"))
	}
	t.Logf("%d intents applied exactly once by two processes, %d SIGKILLs", len(want), kills)
}

// TestCommitThenCrash: a process commits a batch and dies by SIGKILL before
// it could ack. The commit is in the file; the redelivery finds every row
// and applies nothing twice.
func TestCommitThenCrash(t *testing.T) {
	path, db := newFile(t)
	cmd := startChild(t, path, "commit-crash")
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !exit.Sys().(syscall.WaitStatus).Signaled() {
		t.Fatalf("child: %v, want killed by SIGKILL after its commit", err)
	}
	batch := crashBatch()
	want := map[string]inbox.Message{}
	for _, m := range batch {
		want[m.ID] = m
	}
	// A new handle, as the restarted process would open.
	db2 := open(t, path)
	if v := storetest.Violations(t, snapshot(t, db2), want); len(v) > 0 {
		t.Fatalf("the committed batch is not all there after the crash:\n%s", strings.Join(v, "\n"))
	}
	p, err := inbox.NewProcessor(sqliteinbox.New(db2), effects.NewSQLiteLedger(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Process(context.Background(), batch)
	if err != nil || storetest.Statuses(out) != "duplicate,duplicate,duplicate" {
		t.Fatalf("redelivery: %s, %v", storetest.Statuses(out), err)
	}
	if v := storetest.Violations(t, snapshot(t, db), want); len(v) > 0 {
		t.Fatalf("after the redelivery:\n%s", strings.Join(v, "\n"))
	}
}
