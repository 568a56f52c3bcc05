package deliverchaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/internal/deliveryhook"
	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/jitter"
)

// childArg, first after `chaos -deliver`, runs one dispatcher process of
// the chaos run instead of the run: the harness starts its dispatchers as
// `jetinbox chaos -deliver -dispatcher-child FLAGS`, this binary again,
// so that it can SIGKILL them. It is not in the command's help.
const childArg = "-dispatcher-child"

// Child runs `chaos -deliver -dispatcher-child FLAGS` as the
// [subproc.RoleJetinbox] role of a test binary (which cannot link the
// CLI): the chaos run's dispatcher processes. SIGTERM and SIGINT stop
// the dispatcher after its calls in flight; the exit code is 0, 1 for a
// failure, 2 for bad flags.
func Child(args []string) int {
	if len(args) < 3 || args[0] != "chaos" || args[1] != "-deliver" || args[2] != childArg {
		fmt.Fprintf(os.Stderr, "this binary runs only `chaos -deliver %s` as a jetinbox child, not %q\n", childArg, args)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := runChild(ctx, args[3:], os.Stderr)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, err)
		return 2
	default:
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
}

type usageError struct{ error }

// dispatcherConfig is every dispatcher's configuration in the run: short
// waits, so that a run takes seconds, and a lease longer than the
// endpoint's timeout, so that a killed dispatcher's rows come back soon.
func dispatcherConfig(url string, log *slog.Logger) delivery.Config {
	ep := delivery.Endpoint{Name: "receiver", URL: url, Timeout: delivery.Duration(300 * time.Millisecond), KeyRetention: delivery.Duration(time.Hour), Concurrency: 8}
	return delivery.Config{Endpoints: []delivery.Endpoint{ep}, Lease: time.Second,
		Retry:   jitter.Policy{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond},
		Idle:    jitter.Policy{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond},
		Breaker: delivery.BreakerConfig{Failures: 20, Open: jitter.Policy{Base: 100 * time.Millisecond, Cap: 500 * time.Millisecond}},
		Logger:  log}
}

// runChild is one dispatcher process: the shipped dispatcher and
// PostgreSQL store, in a process of its own, until ctx ends.
func runChild(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox chaos -deliver "+childArg, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "the run's database")
	url := fs.String("url", "", "the receiver's URL")
	keyPerTry := fs.Bool("key-per-attempt", false, "unsafe: a new key for every attempt")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *dbURL == "" || *url == "" {
		return usageError{errors.New("-database-url and -url are required")}
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return usageError{err}
	}
	defer pool.Close()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	d, err := delivery.NewDispatcher(pgdelivery.New(pool), dispatcherConfig(*url, log))
	if err != nil {
		return usageError{err}
	}
	if *keyPerTry {
		deliveryhook.Attach(d, &deliveryhook.Faults{NewKeyPerAttempt: true})
	}
	return d.Run(ctx)
}

// fleet keeps Dispatchers dispatcher processes running: each in a slot
// that starts a fresh process when the one before was killed.
type fleet struct {
	ctx    context.Context
	cancel context.CancelFunc
	args   []string // the child's flags but -url
	url    string   // the receiver's; a process's own ends in /<its id>

	mu     sync.Mutex
	procs  map[int]*proc
	nextID int
	err    error

	kills, starts atomic.Int64
	slots         sync.WaitGroup
}

// proc is one dispatcher process.
type proc struct {
	cmd    *exec.Cmd
	dead   chan struct{} // closed once the process was reaped
	killed atomic.Bool
	stderr tail
}

// newFleet returns a fleet of dispatcher processes of the receiver at
// url, the child's flags args; [fleet.run] starts them.
func newFleet(ctx context.Context, url string, args ...string) *fleet {
	f := &fleet{url: url, args: args, procs: map[int]*proc{}}
	f.ctx, f.cancel = context.WithCancel(ctx)
	return f
}

// run starts n slots.
func (f *fleet) run(n int) {
	for range n {
		f.slots.Add(1)
		go f.slot()
	}
}

// slot runs one process after another until the fleet stops: a process
// that ends without being killed fails the run.
func (f *fleet) slot() {
	defer f.slots.Done()
	for f.ctx.Err() == nil {
		p, err := f.start()
		if err != nil {
			f.fail(err)
			return
		}
		select {
		case <-p.dead:
		case <-f.ctx.Done():
			// SIGTERM: the dispatcher finishes its calls in flight and
			// records them; SIGKILL if it has not within a minute.
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.dead:
			case <-time.After(time.Minute):
				_ = p.cmd.Process.Kill()
				<-p.dead
			}
			return
		}
		if !p.killed.Load() && f.ctx.Err() == nil {
			f.fail(fmt.Errorf("a dispatcher process ended by itself (%v): %s", p.cmd.ProcessState, p.stderr.String()))
			return
		}
	}
}

func (f *fleet) start() (*proc, error) {
	f.mu.Lock()
	f.nextID++
	id := f.nextID
	f.mu.Unlock()
	args := append([]string{"chaos", "-deliver", childArg, "-url", f.url + "/" + strconv.Itoa(id)}, f.args...)
	cmd, err := subproc.Command(context.WithoutCancel(f.ctx), subproc.RoleJetinbox, args...)
	if err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, dead: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = io.Discard, &p.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a dispatcher process: %w", err)
	}
	f.starts.Add(1)
	go func() {
		_ = cmd.Wait()
		close(p.dead)
		f.mu.Lock()
		delete(f.procs, id)
		f.mu.Unlock()
	}()
	f.mu.Lock()
	f.procs[id] = p
	f.mu.Unlock()
	return p, nil
}

// kill SIGKILLs process id and returns once it is dead; false if it was
// already dead or being killed.
func (f *fleet) kill(id int) bool {
	f.mu.Lock()
	p := f.procs[id]
	f.mu.Unlock()
	if p == nil || !p.killed.CompareAndSwap(false, true) {
		return false
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.dead:
	case <-time.After(time.Minute):
		f.fail(fmt.Errorf("a SIGKILLed dispatcher process was not reaped within a minute"))
		return false
	}
	f.kills.Add(1)
	return true
}

func (f *fleet) fail(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
}

// failed returns the first failure of a slot, if any.
func (f *fleet) failed() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// stop ends every process (SIGTERM) and every slot.
func (f *fleet) stop() error {
	f.cancel()
	f.slots.Wait()
	return f.failed()
}

// tail keeps the last few KiB a process wrote.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 4096 {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-4096:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
