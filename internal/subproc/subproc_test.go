package subproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	Dispatch(map[string]func([]string) int{
		RoleNATSServer: NATSServer,
		"echo": func(args []string) int {
			fmt.Printf("%s role=%q\n", strings.Join(args, " "), os.Getenv(EnvRole))
			code, _ := strconv.Atoi(args[0])
			return code
		},
		// spawn starts a sleeping grandchild, prints its pid and sleeps.
		"spawn": func([]string) int {
			cmd, err := Command(context.Background(), "sleep")
			if err != nil || cmd.Start() != nil {
				return 1
			}
			fmt.Println(cmd.Process.Pid)
			time.Sleep(time.Minute)
			return 0
		},
		"sleep": func([]string) int { time.Sleep(time.Minute); return 0 },
	})
	os.Exit(m.Run())
}

// TestChildRole: a child runs its role with the arguments, its exit code
// comes back, and the role is not left in its environment.
func TestChildRole(t *testing.T) {
	cmd, err := Command(context.Background(), "echo", "3", "b")
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.Output()
	if ExitCode(err) != 3 || string(out) != "3 b role=\"\"\n" {
		t.Fatalf("echo child: %q, exit %d (%v)", out, ExitCode(err), err)
	}
	if _, err := Command(context.Background(), "meteor"); err == nil {
		t.Fatal("Command started a role nobody registered")
	}
}

// TestUnknownRoleExits2: a child asked for a role the binary does not run
// exits 2 instead of running the binary's own main (here: the tests).
func TestUnknownRoleExits2(t *testing.T) {
	cmd, err := Command(context.Background(), "echo")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(withoutRole(cmd.Env), EnvRole+"=meteor")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if ExitCode(err) != 2 || !strings.Contains(stderr.String(), "no such child role") {
		t.Fatalf("unknown role: exit %d, %q", ExitCode(err), stderr.String())
	}
}

// TestChildDiesWithParent: when a parent dies by SIGKILL, its children
// exit instead of living on as orphans.
func TestChildDiesWithParent(t *testing.T) {
	cmd, err := Command(context.Background(), "spawn")
	if err != nil {
		t.Fatal(err)
	}
	r, w, _ := os.Pipe()
	cmd.Stdout = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var pid int
	if _, err := fmt.Fscan(r, &pid); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("grandchild %d not running: %v", pid, err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := syscall.Kill(pid, 0)
		if errors.Is(err, syscall.ESRCH) {
			return
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("grandchild %d still there 10s after its parent was killed (%v)", pid, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNATSServerRole: a bad configuration exits 2; a good one serves until
// SIGTERM and exits 0.
func TestNATSServerRole(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.conf")
	if err := os.WriteFile(bad, []byte("listen: [unclosed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, err := Command(context.Background(), RoleNATSServer, "-c", bad)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); ExitCode(err) != 2 {
		t.Fatalf("bad config: exit %d: %s", ExitCode(err), out)
	}
	good := filepath.Join(dir, "good.conf")
	conf := fmt.Sprintf("listen: \"127.0.0.1:-1\"\njetstream { store_dir: %q }\n", filepath.Join(dir, "js"))
	if err := os.WriteFile(good, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	if cmd, err = Command(context.Background(), RoleNATSServer, "-c", good); err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(log.String(), "Server is ready") {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("not ready: %s", <-done)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), "JetStream") {
		t.Errorf("JetStream not started:\n%s", log.String())
	}
}

// syncBuffer is a bytes.Buffer the child's output copier and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
