// The cluster run's faults that need processes: leaders paused past the
// election timeout, a consumer process paused past AckWait, a stream peer
// replaced by a fresh server while a node is cut off.

package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// The durable's settings, the same for the in-process workers and the
// consumer processes, so that neither changes the durable the other made.
const (
	consumerBatch         = 100
	consumerMaxDeliver    = 100
	consumerMaxAckPending = 0 // the default: 4 × batch × in-flight batches
)

// ConsumerRole runs `consumer ARGS` (the consumer command of
// internal/cli) as the [subproc.RoleJetinbox] role of a test binary, which
// cannot link internal/app (it imports this package): chaos runs started
// from tests start their consumer processes with it. SIGTERM and SIGINT
// drain the consumer; the exit code is the CLI's.
func ConsumerRole(args []string) int {
	if len(args) == 0 || args[0] != "consumer" {
		fmt.Fprintf(os.Stderr, "this binary runs only `consumer` as a jetinbox child, not %q\n", args)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Consumer(ctx, args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	cli.ReportError(os.Stderr, "consumer", args[1:], os.Getenv, "json", err)
	return cli.ExitCode(err)
}

// workerLife waits while the in-process workers are held and returns the
// context of worker w's next life; false once ctx ended.
func (r *clusterRun) workerLife(ctx context.Context, w int) (context.Context, bool) {
	r.workMu.Lock()
	defer r.workMu.Unlock()
	for r.held && ctx.Err() == nil {
		r.workCond.Wait()
	}
	if ctx.Err() != nil {
		return nil, false
	}
	lctx, cancel := context.WithCancel(ctx)
	r.cancels[w] = cancel
	r.working++
	return lctx, true
}

func (r *clusterRun) workerDone(w int) {
	r.workMu.Lock()
	defer r.workMu.Unlock()
	if c := r.cancels[w]; c != nil {
		c()
	}
	delete(r.cancels, w)
	r.working--
	r.workCond.Broadcast()
}

// holdWorkers stops the in-process workers (they shut down as a deployed
// consumer does, handing back what they hold) and keeps them from starting
// until it is called with false.
func (r *clusterRun) holdWorkers(hold bool) {
	r.workMu.Lock()
	defer r.workMu.Unlock()
	r.held = hold
	if hold {
		for _, c := range r.cancels {
			c()
		}
		for r.working > 0 {
			r.workCond.Wait()
		}
	}
	r.workCond.Broadcast()
}

// pauseLeader stops node l with SIGSTOP until the others elected a new
// leader (past the election timeout, a few seconds), leaves it stopped a
// while longer, then continues it with SIGCONT: it wakes up believing it
// still leads, with clients and routes that moved on.
func (r *clusterRun) pauseLeader(ctx context.Context, l int, role string, leader func() int) (string, error) {
	if err := r.cl.Pause(l); err != nil {
		return "", err
	}
	t0 := time.Now()
	r.say("  paused %s (%s, pid %d)", r.cl.Name(l), role, r.cl.Pid(l))
	nl, err := r.waitNewLeader(ctx, l, leader)
	if err != nil {
		_ = r.cl.Resume(l)
		return "", err
	}
	elected := time.Since(t0)
	time.Sleep(time.Second) // the old leader sleeps on while the new one works
	if err := r.cl.Resume(l); err != nil {
		return "", err
	}
	r.say("  resumed %s after %.1fs; %s elected after %.1fs", r.cl.Name(l), time.Since(t0).Seconds(), r.cl.Name(nl), elected.Seconds())
	return fmt.Sprintf("%s (%s) stopped %.1fs; %s elected after %.1fs; resumed", r.cl.Name(l), role, time.Since(t0).Seconds(), r.cl.Name(nl), elected.Seconds()), nil
}

// consumerProc is a `jetinbox consumer` child on the run's durable and
// database.
type consumerProc struct {
	name string
	cmd  *exec.Cmd
	log  *testenv.LogTail
	done chan error
}

func (r *clusterRun) startConsumerProc(ctx context.Context, name string) (*consumerProc, error) {
	cmd, err := subproc.Command(ctx, subproc.RoleJetinbox, "consumer", "-http", "", "-durable", r.durable, "-stream", r.stream,
		"-batch", strconv.Itoa(consumerBatch), "-max-deliver", strconv.Itoa(consumerMaxDeliver), "-max-ack-pending", strconv.Itoa(consumerMaxAckPending),
		"-ack-wait", r.o.AckWait.String(), "-log-format", "json")
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	cmd.Env = append(cmd.Env, "NATS_URL="+r.cl.URLs(), "DATABASE_URL="+r.dbURL)
	p := &consumerProc{name: name, cmd: cmd, log: testenv.NewLogTail(100), done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if r.o.Logger != nil {
		cmd.Stderr = &logLines{tail: p.log, log: r.o.Logger.With("consumer", name)}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chaos: start consumer process %s: %w", name, err)
	}
	go func() { p.done <- cmd.Wait() }()
	r.say("  started consumer process %s (pid %d)", name, cmd.Process.Pid)
	return p, nil
}

// stop drains the process with SIGTERM (SIGCONT first, should it be
// stopped) and waits for it; a process that does not exit in time is
// killed.
func (p *consumerProc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			return fmt.Errorf("chaos: consumer process %s: %w:\n%s", p.name, err, p.log)
		}
		return nil
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("chaos: consumer process %s did not drain within a minute of SIGTERM:\n%s", p.name, p.log)
	}
}

// consumerPause: the in-process workers step aside for two consumer
// processes. The first runs alone until it is stopped (SIGSTOP) holding
// messages it has not acked; the second starts, and once AckWait ran out
// it is given those messages again and settles them, or waits for rows the
// sleeper locked. The sleeper stays stopped for more than AckWait, then
// continues (SIGCONT): whatever it was doing (fetched, mid-transaction,
// committed but not acked) it finishes late, and only the inbox keeps the
// effect from being applied twice.
func (r *clusterRun) consumerPause(ctx context.Context) (note string, err error) {
	r.holdWorkers(true)
	defer r.holdWorkers(false)
	cons, err := r.js.Consumer(ctx, r.stream, r.durable)
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	pending := func() int {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ci, err := cons.Info(ictx)
		if err != nil {
			return -1
		}
		return ci.NumAckPending
	}
	base := pending()
	a, err := r.startConsumerProc(ctx, "A")
	if err != nil {
		return "", err
	}
	defer func() {
		if serr := a.stop(); err == nil && serr != nil {
			err = serr
		}
	}()
	// Stop A the moment it holds messages: stopped, it acks nothing, so
	// what the durable counts as unacked beyond what the workers left is
	// A's. Not holding any yet: let it go on a little and try again.
	held := 0
	for try := 0; try < 200 && ctx.Err() == nil; try++ {
		time.Sleep(time.Duration(20+try%5*10) * time.Millisecond)
		if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
			return "", fmt.Errorf("chaos: SIGSTOP consumer A: %w:\n%s", err, a.log)
		}
		if held = pending() - base; held > 0 {
			break
		}
		_ = syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT)
	}
	if held <= 0 {
		return "", fmt.Errorf("chaos: consumer process A held no messages in 200 tries:\n%s", a.log)
	}
	t0 := time.Now()
	r.say("  stopped consumer process A holding %d unacked messages", held)
	b, err := r.startConsumerProc(ctx, "B")
	if err != nil {
		return "", err
	}
	defer func() {
		if serr := b.stop(); err == nil && serr != nil {
			err = serr
		}
	}()
	time.Sleep(2*r.o.AckWait + time.Second)
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		return "", fmt.Errorf("chaos: SIGCONT consumer A: %w", err)
	}
	r.say("  continued consumer process A after %.1fs (AckWait %s)", time.Since(t0).Seconds(), r.o.AckWait)
	// Both work on until the phase's intents are out (phase waits), then
	// drain; the workers come back.
	time.Sleep(time.Second)
	return fmt.Sprintf("consumer process A stopped %.1fs (AckWait %s) holding %d unacked; B took over; A continued", time.Since(t0).Seconds()-1, r.o.AckWait, held), nil
}

// membership replaces a stream peer while publishing: a fresh server
// joins, one node is cut off, a follower of the stream is removed from it
// (the meta leader places the replica on the fresh server, which catches
// up), the cut-off node is healed, and the phase ends with the stream
// current on three peers, the removed one not among them.
func (r *clusterRun) membership(ctx context.Context) (string, error) {
	l, err := r.cl.WaitStreamLeader(ctx, r.stream)
	if err != nil {
		return "", err
	}
	peers := r.cl.StreamPeers(r.stream)
	var followers []int
	for _, p := range peers {
		if p != l {
			followers = append(followers, p)
		}
	}
	if len(followers) < 2 {
		return "", fmt.Errorf("stream peers %v under leader %s: want two followers", peers, r.cl.Name(l))
	}
	victim, cut := followers[0], followers[1]
	n, err := r.cl.AddNode(ctx)
	if err != nil {
		return "", err
	}
	r.say("  %s joined the cluster (pid %d)", r.cl.Name(n), r.cl.Pid(n))
	r.cl.Partition(cut)
	r.say("  partitioned %s (a stream follower)", r.cl.Name(cut))
	// The operator asks through a node on the majority side: the run's
	// own connection may sit on the node cut off, which cannot reach the
	// meta leader.
	op, err := connectAll(r.cl.URL(l), "chaos-operator")
	if err != nil {
		return "", err
	}
	defer op.Close()
	var last error
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = r.cl.RemovePeer(rctx, op, r.stream, victim)
		cancel()
		if last == nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if last != nil {
		return "", fmt.Errorf("peer remove: %w (last: %w)", ctx.Err(), last)
	}
	r.say("  removed %s from the stream's peers", r.cl.Name(victim))
	time.Sleep(2 * time.Second) // the change goes on while the node is cut off
	if err := r.cl.Heal(cut); err != nil {
		return "", err
	}
	r.say("  healed %s", r.cl.Name(cut))
	if err := r.cl.WaitStreamCurrent(ctx, r.stream); err != nil {
		return "", err
	}
	var now []int
	err = pollUntil(ctx, func() bool {
		now = r.cl.StreamPeers(r.stream)
		return len(now) == 3 && !slices.Contains(now, victim) && slices.Contains(now, n)
	})
	if err != nil {
		return "", fmt.Errorf("stream peers %v after replacing %s by %s: %w", r.peerNames(now), r.cl.Name(victim), r.cl.Name(n), err)
	}
	if err := r.cl.WaitStreamCurrent(ctx, r.stream); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s joined; %s removed from the stream while %s was cut off; peers %v, current", r.cl.Name(n), r.cl.Name(victim), r.cl.Name(cut), r.peerNames(now)), nil
}

func (r *clusterRun) peerNames(is []int) []string {
	ns := make([]string, len(is))
	for k, i := range is {
		ns[k] = r.cl.Name(i)
	}
	return ns
}

// pollUntil checks ok every 100ms until it holds or ctx ends.
func pollUntil(ctx context.Context, ok func() bool) error {
	for !ok() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// logLines keeps a consumer process's log lines in its tail and passes
// them to the run's logger.
type logLines struct {
	tail *testenv.LogTail
	log  interface{ Info(string, ...any) }
}

func (l *logLines) Write(p []byte) (int, error) {
	l.log.Info("process", "line", string(p))
	return l.tail.Write(p)
}
