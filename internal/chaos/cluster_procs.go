// The cluster run's faults that need processes: leaders paused past the
// election timeout, a consumer process paused past AckWait, a stream peer
// replaced by a fresh server while a node is cut off.

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/intake"
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
// internal/cli), or `intake ARGS` (jetinbox intake), as the [subproc.RoleJetinbox] role of a test binary, which
// cannot link internal/app (it imports this package): chaos runs started
// from tests start their consumer processes with it. SIGTERM and SIGINT
// drain the consumer; the exit code is the CLI's.
func ConsumerRole(args []string) int {
	if len(args) > 0 && args[0] == "intake" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := intake.Main(ctx, args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
		stop()
		cli.ReportError(os.Stderr, "intake", args[1:], os.Getenv, "json", err)
		return cli.ExitCode(err)
	}
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
	// The application name finds the process's sessions in
	// pg_stat_activity. A session left idle in a transaction longer than
	// AckWait is ended by the server, as production settings do: a
	// consumer paused mid-transaction then meets a commit that fails when
	// it wakes, and must not have acked.
	dsn := r.dbURL + "&application_name=chaos-consumer-" + name +
		// pgx reads a "+" in the query as itself, not as a space.
		"&options=" + strings.ReplaceAll(url.QueryEscape(fmt.Sprintf("-c idle_in_transaction_session_timeout=%d", r.o.AckWait.Milliseconds())), "+", "%20")
	cmd.Env = append(cmd.Env, "NATS_URL="+r.cl.URLs(), "DATABASE_URL="+dsn)
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

// prepareConsumerPause makes way for consumer-pause before its phase
// publishes: the in-process workers step aside and the first consumer
// process starts, so that the fault meets it busy. The returned cleanup
// undoes what the fault did not.
func (r *clusterRun) prepareConsumerPause(ctx context.Context) (cleanup func(), err error) {
	r.holdWorkers(true)
	cleanup = func() {
		if r.pauseA != nil {
			_ = r.pauseA.stop()
			r.pauseA = nil
		}
		r.holdWorkers(false)
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	if r.pauseCons, err = r.js.Consumer(ctx, r.stream, r.durable); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	ci, err := r.pauseCons.Info(ictx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	// What the workers handed back and nobody took yet.
	r.pauseBase = ci.NumAckPending
	if r.pauseA, err = r.startConsumerProc(ctx, "A"); err != nil {
		return nil, err
	}
	// Past its start: the schema check is a transaction too.
	if err := pollUntil(ctx, func() bool { return strings.Contains(r.pauseA.log.String(), "consumer: running") }); err != nil {
		return nil, fmt.Errorf("chaos: consumer process A did not start: %w:\n%s", err, r.pauseA.log)
	}
	return cleanup, nil
}

// consumerPause: the in-process workers stepped aside for two consumer
// processes (prepareConsumerPause). The first is stopped (SIGSTOP) inside
// a batch's transaction, caught where pg_stat_activity shows the server
// waiting on it, or failing that while it holds messages it has not
// acked. The second starts; once AckWait ran out it is given those
// messages again, and the server ends the sleeper's idle transaction
// (idle_in_transaction_session_timeout, AckWait) and so releases the rows
// it locked. The sleeper stays stopped for more than twice AckWait, then
// continues (SIGCONT): its commit fails and it tries the batch again, or
// it acks what it had committed, late; only the inbox keeps an effect
// from being applied twice.
func (r *clusterRun) consumerPause(ctx context.Context) (note string, err error) {
	a, base, cons := r.pauseA, r.pauseBase, r.pauseCons
	if a == nil {
		return "", errors.New("chaos: consumer-pause without its first consumer process")
	}
	r.pauseA = nil
	aStopped := false
	defer func() {
		if !aStopped {
			_ = a.stop()
		}
	}()
	pending := func() int {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ci, err := cons.Info(ictx)
		if err != nil {
			return -1
		}
		return ci.NumAckPending
	}
	// Stop A in the middle of a transaction if it can be caught there
	// (its session is in a transaction in pg_stat_activity), else the
	// moment it holds messages it has not acked: stopped, it acks nothing,
	// so what the durable counts as unacked beyond what the workers left
	// is A's.
	stop := func() error {
		if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
			select {
			case werr := <-a.done:
				a.done <- werr
				err = fmt.Errorf("%w (it exited: %v)", err, werr)
			default:
			}
			return fmt.Errorf("chaos: SIGSTOP consumer A: %w:\n%s", err, a.log)
		}
		return nil
	}
	// The server waits on A inside a transaction: stopped now, A sends
	// nothing more of it (a statement already sent would still run, and a
	// COMMIT among them would commit).
	inTx := func() bool {
		var n int
		err := r.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'chaos-consumer-A' AND state = 'idle in transaction'`).Scan(&n)
		return err == nil && n > 0
	}
	held, midTx := 0, false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; {
		if !inTx() {
			continue
		}
		if err := stop(); err != nil {
			return "", err
		}
		time.Sleep(50 * time.Millisecond) // what A sent before it stopped has run
		// Past its start, A's only transactions are batches'. Its count
		// of unacked messages may be 0 if it acked before committing.
		if inTx() {
			held, midTx = pending()-base, true
			break
		}
		_ = syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT)
	}
	for try := 0; !midTx && try < 200 && ctx.Err() == nil; try++ {
		time.Sleep(time.Duration(20+try%5*10) * time.Millisecond)
		if err := stop(); err != nil {
			return "", err
		}
		if held = pending() - base; held > 0 {
			break
		}
		_ = syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT)
	}
	if held <= 0 && !midTx {
		return "", fmt.Errorf("chaos: consumer process A held no messages in 200 tries:\n%s", a.log)
	}
	where := "holding"
	if midTx {
		where = "in a transaction, holding"
	}
	t0 := time.Now()
	r.say("  stopped consumer process A %s %d unacked messages", where, held)
	b, err := r.startConsumerProc(ctx, "B")
	if err != nil {
		return "", err
	}
	bStopped := false
	defer func() {
		if !bStopped {
			_ = b.stop()
		}
	}()
	time.Sleep(2*r.o.AckWait + time.Second)
	if midTx {
		where = "in a transaction (the server ended it), holding"
		if inTx() {
			where = "in a transaction (still open), holding"
		}
	}
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		// A stopped process does not exit by itself: say how it ended
		// (the signal that killed it, or the run's context ending).
		select {
		case werr := <-a.done:
			a.done <- werr
			err = fmt.Errorf("%w (it ended while stopped: %v; run context: %v)", err, werr, ctx.Err())
		case <-time.After(5 * time.Second):
		}
		return "", fmt.Errorf("chaos: SIGCONT consumer A: %w:\n%s", err, a.log)
	}
	stopped := time.Since(t0)
	r.say("  continued consumer process A after %.1fs (AckWait %s)", stopped.Seconds(), r.o.AckWait)
	// Both work on a while, then drain; the workers come back.
	time.Sleep(time.Second)
	bStopped, aStopped = true, true
	if err := errors.Join(b.stop(), a.stop()); err != nil {
		return "", err
	}
	return fmt.Sprintf("consumer process A stopped %.1fs (AckWait %s) %s %d unacked; B %s; A continued: %s", stopped.Seconds(), r.o.AckWait, where, held, b.summary(), a.summary()), nil
}

// summary is what the process said it did when it stopped (over its whole
// life): deliveries, applied, found applied by the inbox.
func (p *consumerProc) summary() string {
	for _, line := range strings.Split(p.log.String(), "\n") {
		var l struct {
			Msg        string `json:"msg"`
			Received   int    `json:"received"`
			Applied    int    `json:"applied"`
			Duplicates int    `json:"duplicates"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "consumer: stopped" {
			return fmt.Sprintf("received %d, applied %d, found %d applied", l.Received, l.Applied, l.Duplicates)
		}
	}
	return "said nothing on stopping"
}

// membership replaces a stream peer while publishing: a fresh server
// joined before the phase (r.fresh), one node is cut off, a follower of
// the stream is removed from it (the meta leader places the replica on
// the fresh server, which catches up), the cut-off node is healed, and
// the phase ends with the stream current on three peers, the removed one
// not among them.
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
	victim, cut, n := followers[0], followers[1], r.fresh
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
