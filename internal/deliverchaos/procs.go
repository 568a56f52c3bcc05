package deliverchaos

import (
	"bufio"
	"context"
	"encoding/json"
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
// PostgreSQL store, in a process of its own, until ctx ends. With
// -stdin-flags it waits for its other flags on standard input (one line, a
// JSON array): the harness starts processes ahead of need, so that a
// killed dispatcher's replacement goes to work at once instead of after
// this binary's start-up (about a second under -race).
func runChild(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox chaos -deliver "+childArg, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "the run's database")
	url := fs.String("url", "", "the receiver's URL")
	keyPerTry := fs.Bool("key-per-attempt", false, "unsafe: a new key for every attempt")
	stdinFlags := fs.Bool("stdin-flags", false, "read the other flags from standard input (a JSON array on one line), then start")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *stdinFlags {
		line := make(chan []byte, 1)
		go func() {
			b, _ := bufio.NewReader(os.Stdin).ReadBytes('\n')
			line <- b
		}()
		var b []byte
		select {
		case b = <-line:
		case <-ctx.Done():
			return nil
		}
		var more []string
		if err := json.Unmarshal(b, &more); err != nil {
			return usageError{fmt.Errorf("-stdin-flags: %w", err)}
		}
		if err := fs.Parse(more); err != nil {
			return usageError{err}
		}
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

// fleet is the run's dispatcher processes: spares started ahead of need,
// waiting for their flags, and the working ones of the current row.
type fleet struct {
	ctx    context.Context
	cancel context.CancelFunc
	spares chan *proc

	mu     sync.Mutex
	procs  map[int]*proc // by ID, the working ones
	nextID int
	err    error
	wg     sync.WaitGroup // the spares being started
}

// proc is one dispatcher process.
type proc struct {
	id     int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	dead   chan struct{} // closed once the process was reaped
	killed atomic.Bool
	stderr tail
}

// newFleet starts n spares; [fleet.close] ends every process.
func newFleet(ctx context.Context, n int) *fleet {
	f := &fleet{spares: make(chan *proc, n), procs: map[int]*proc{}}
	f.ctx, f.cancel = context.WithCancel(ctx)
	for range n {
		f.addSpare()
	}
	return f
}

// addSpare starts a spare in the background.
func (f *fleet) addSpare() {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		p, err := f.spawn()
		if err != nil {
			f.fail(err)
			return
		}
		f.spares <- p // never blocks: a spare is only added for one taken
	}()
}

func (f *fleet) spawn() (*proc, error) {
	f.mu.Lock()
	f.nextID++
	p := &proc{id: f.nextID, dead: make(chan struct{})}
	f.mu.Unlock()
	cmd, err := subproc.Command(context.WithoutCancel(f.ctx), subproc.RoleJetinbox, "chaos", "-deliver", childArg, "-stdin-flags")
	if err != nil {
		return nil, err
	}
	p.cmd = cmd
	cmd.Stdout, cmd.Stderr = io.Discard, &p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a dispatcher process: %w", err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.dead)
	}()
	return p, nil
}

// take puts a spare to work with the flags of a row, its receiver URL
// ending in /<its ID>, and starts another spare.
func (f *fleet) take(url string, args []string) (*proc, error) {
	var p *proc
	select {
	case p = <-f.spares:
	case <-f.ctx.Done():
		return nil, f.ctx.Err()
	}
	f.addSpare()
	line, _ := json.Marshal(append([]string{"-url", url + "/" + strconv.Itoa(p.id)}, args...))
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		f.stopProc(p)
		return nil, fmt.Errorf("start a dispatcher process: %w (%s)", err, p.stderr.String())
	}
	f.mu.Lock()
	f.procs[p.id] = p
	f.mu.Unlock()
	return p, nil
}

// kill SIGKILLs working process id and returns once it is dead; false if
// it was not working or already being killed.
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
		return true
	case <-time.After(time.Minute):
		f.fail(fmt.Errorf("a SIGKILLed dispatcher process was not reaped within a minute"))
		return false
	}
}

// stopProc ends p with SIGTERM: the dispatcher finishes its calls in
// flight and records them; SIGKILL if it has not within a minute.
func (f *fleet) stopProc(p *proc) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.dead:
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.dead
	}
	f.mu.Lock()
	delete(f.procs, p.id)
	f.mu.Unlock()
}

func (f *fleet) fail(err error) {
	f.mu.Lock()
	if f.err == nil && f.ctx.Err() == nil {
		f.err = err
	}
	f.mu.Unlock()
}

// failed returns the first failure, if any.
func (f *fleet) failed() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// close ends the spares (SIGKILL: they hold nothing yet); the rows end
// their working processes.
func (f *fleet) close() {
	f.cancel()
	f.wg.Wait()
	var spares []*proc
	for len(f.spares) > 0 {
		p := <-f.spares
		_ = p.cmd.Process.Kill()
		spares = append(spares, p)
	}
	for _, p := range spares {
		<-p.dead
	}
}

// crew is one row's working processes: Dispatchers slots, each putting a
// spare to work when its process was killed.
type crew struct {
	f     *fleet
	ctx   context.Context
	stop_ context.CancelFunc
	url   string
	args  []string
	slots sync.WaitGroup

	kills, starts atomic.Int64
}

// startCrew puts n processes to work for the receiver at url with the
// child's flags args.
func (f *fleet) startCrew(ctx context.Context, n int, url string, args ...string) *crew {
	c := &crew{f: f, url: url, args: args}
	c.ctx, c.stop_ = context.WithCancel(ctx)
	for range n {
		c.slots.Add(1)
		go c.slot()
	}
	return c
}

// slot runs one process after another until the row ends: a process that
// ends without being killed fails the run.
func (c *crew) slot() {
	defer c.slots.Done()
	for c.ctx.Err() == nil {
		p, err := c.f.take(c.url, c.args)
		if err != nil {
			c.f.fail(err)
			return
		}
		c.starts.Add(1)
		select {
		case <-p.dead:
		case <-c.ctx.Done():
			// The row is over: nothing of it is pending, so nothing is
			// in flight that SIGTERM would let finish.
			_ = p.cmd.Process.Kill()
			<-p.dead
			c.f.mu.Lock()
			delete(c.f.procs, p.id)
			c.f.mu.Unlock()
			return
		}
		c.f.mu.Lock()
		delete(c.f.procs, p.id)
		c.f.mu.Unlock()
		if !p.killed.Load() {
			c.f.fail(fmt.Errorf("a dispatcher process ended by itself (%v): %s", p.cmd.ProcessState, p.stderr.String()))
			return
		}
	}
}

// kill is the receiver's: SIGKILL the working process id, counted.
func (c *crew) kill(id int) bool {
	if !c.f.kill(id) {
		return false
	}
	c.kills.Add(1)
	return true
}

// stop ends the row's processes (SIGTERM) and returns the run's first
// failure, if any.
func (c *crew) stop() error {
	c.stop_()
	c.slots.Wait()
	return c.f.failed()
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
