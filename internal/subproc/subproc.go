// Package subproc runs this binary again as a child process in a named
// role: a nats-server, the jetinbox CLI. Faults that only a process can
// suffer (SIGKILL, SIGSTOP and SIGCONT, a power loss that takes every
// process at once) need servers and consumers in processes of their own,
// and re-executing the running binary needs nothing installed.
//
// A binary that starts children calls [Dispatch] first thing in main (or
// TestMain); [Command] refuses a role the running binary did not register,
// so a test binary never starts a copy of its own tests.
package subproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
)

// EnvRole names the role a child runs; Dispatch removes it from the
// child's environment, so that the child's own children do not inherit it.
const EnvRole = "JETINBOX_CHILD"

// envWatch names the descriptor of the pipe a child watches: the parent
// holds its write end open as long as it lives, so the child sees EOF
// when the parent dies, even by SIGKILL, and exits instead of lingering
// as an orphan holding ports and stores.
const envWatch = "JETINBOX_CHILD_WATCH"

var (
	mu         sync.Mutex
	registered map[string]bool
	watchR     *os.File // read end handed to every child
	watchW     *os.File // write end, held open for the life of the process
	watchErr   error
)

// Dispatch runs the process as a child when JETINBOX_CHILD names a role in
// roles, then exits with its code; otherwise it returns, and records the
// roles for [Command]. A JETINBOX_CHILD that names no role in roles exits
// with code 2: running the binary's ordinary main instead (a test binary's
// tests) would be worse. Called first thing in cmd/jetinbox's main and in
// TestMain of packages whose tests start children.
func Dispatch(roles map[string]func(args []string) int) {
	role, ok := os.LookupEnv(EnvRole)
	if !ok {
		mu.Lock()
		registered = map[string]bool{}
		for r := range roles {
			registered[r] = true
		}
		mu.Unlock()
		return
	}
	os.Unsetenv(EnvRole)
	run, ok := roles[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s=%q: this binary runs no such child role (it runs: %s)\n", EnvRole, role, strings.Join(names(roles), ", "))
		os.Exit(2)
	}
	if fd := os.Getenv(envWatch); fd != "" {
		os.Unsetenv(envWatch)
		watchParent(fd)
	}
	mu.Lock()
	registered = map[string]bool{}
	for r := range roles {
		registered[r] = true
	}
	mu.Unlock()
	os.Exit(run(os.Args[1:]))
}

// watchParent exits the child when the parent's end of the watch pipe
// closes, that is when the parent process is gone.
func watchParent(fd string) {
	var n uintptr
	if _, err := fmt.Sscan(fd, &n); err != nil {
		return
	}
	f := os.NewFile(n, "parent-watch")
	if f == nil {
		return
	}
	go func() {
		_, _ = io.Copy(io.Discard, f)
		fmt.Fprintln(os.Stderr, "subproc: parent process gone; exiting")
		os.Exit(1)
	}()
}

func names(roles map[string]func([]string) int) []string {
	ns := make([]string, 0, len(roles))
	for r := range roles {
		ns = append(ns, r)
	}
	sort.Strings(ns)
	return ns
}

// Command returns an exec.Cmd running os.Executable() in role with args
// (environment JETINBOX_CHILD=role on top of this process's). The child
// exits when this process dies. It is an error if this process did not
// register role with [Dispatch]. The caller may add to Env, set Stdout,
// Stderr and Dir, then Start the command; ctx kills it as
// exec.CommandContext does.
func Command(ctx context.Context, role string, args ...string) (*exec.Cmd, error) {
	mu.Lock()
	defer mu.Unlock()
	if !registered[role] {
		if registered == nil {
			return nil, fmt.Errorf("subproc: cannot start a %q child: this binary never called subproc.Dispatch (in main, or TestMain for tests)", role)
		}
		return nil, fmt.Errorf("subproc: cannot start a %q child: this binary's subproc.Dispatch does not register that role", role)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("subproc: %w", err)
	}
	if watchR == nil && watchErr == nil {
		watchR, watchW, watchErr = os.Pipe()
	}
	if watchErr != nil {
		return nil, fmt.Errorf("subproc: parent watch pipe: %w", watchErr)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	// The first extra file is descriptor 3 in the child.
	cmd.ExtraFiles = []*os.File{watchR}
	cmd.Env = append(withoutRole(os.Environ()), EnvRole+"="+role, envWatch+"=3")
	return cmd, nil
}

func withoutRole(env []string) []string {
	out := env[:0:0]
	for _, e := range env {
		if strings.HasPrefix(e, EnvRole+"=") || strings.HasPrefix(e, envWatch+"=") {
			continue
		}
		out = append(out, e)
	}
	return out
}

// ExitCode is the exit code of a child's Wait error: 0 for nil, the
// process's code when it exited, -1 when a signal ended it or it never ran.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}
