// The jetinbox row on a PostgreSQL primary with a standby behind
// pg_auto_failover, while the primary is killed, failed over and cut off:
// once with the standby synchronous (nothing acked may be lost) and once
// with commits that return before the standby has them (what a failover
// of an asynchronous standby loses).

package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
)

// PGFaults are the faults of a failover run.
var PGFaults = []string{
	"kill-primary",  // SIGKILL of the primary's pg_autoctl and postgres: the monitor fails over; the old primary rejoins as secondary
	"lag-then-kill", // the standby's WAL receiver stalled for a second, then the primary killed with the WAL on the wire: the standby is behind when promoted
	"failover",      // pg_autoctl perform failover: a planned switchover
	"kill-postgres", // SIGKILL of the primary's postmaster: its keeper restarts it (crash recovery, no failover)
	"cut",           // every client connection to the primary cut for two seconds (the nodes still see each other)
	// the standby's WAL receiver stalled for three seconds while the commits waiting for it are cancelled
	// (pg_cancel_backend, answered with success and a warning), then the primary killed with the WAL on the wire
	"cancel-sync-wait",
}

// Replication modes, one row each.
const (
	ModeSync  = "synchronous"
	ModeAsync = "asynchronous"
	// ModeSyncAckOnWarning is the synchronous standby with consumers
	// whose pool does not watch commits (made without
	// pginbox.WatchCommits): a commit whose wait for the standby was
	// cancelled is acked on its warning. Unsafe; not in -modes' help: it
	// shows what the watch keeps from being lost.
	ModeSyncAckOnWarning = "synchronous-ack-on-warning"
)

// PGFailoverOptions configures a failover run.
type PGFailoverOptions struct {
	// Intents published per mode.
	Intents int
	// Rate paces the producer (intents per second), so that faults meet
	// batches in flight.
	Rate int
	// Faults is how many faults each mode meets: every one of Kinds once
	// per len(Kinds) faults, in an order drawn with Seed, the same for
	// every mode.
	Faults int
	Kinds  []string
	Seed   uint64
	// Modes to run: ModeSync, ModeAsync.
	Modes    []string
	Progress io.Writer
	Logger   *slog.Logger
}

// PGFailoverRow is one mode's result, counted per intent as the cluster
// run counts.
type PGFailoverRow struct {
	Mode           string
	Intents        int
	Unacknowledged int
	Lost           int
	AppliedOnce    int
	Duplicated     int
	Unexpected     int
	DeadLettered   int
	Elapsed        time.Duration
	Faults         string
	Verify         *verify.Report
}

// Clean reports lost, duplicated and unexpected all 0 and verify clean.
func (r PGFailoverRow) Clean() bool {
	return r.Lost == 0 && r.Duplicated == 0 && r.Unexpected == 0 && r.Verify != nil && r.Verify.Clean()
}

// PGFailoverMain is `jetinbox chaos -pg-failover`: its own flags.
func PGFailoverMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox chaos -pg-failover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := PGFailoverOptions{Progress: stderr}
	var kinds, modes string
	fs.IntVar(&o.Intents, "intents", 2000, "intents published per replication mode")
	fs.IntVar(&o.Rate, "rate", 200, "intents per second the producer publishes")
	fs.IntVar(&o.Faults, "faults", len(PGFaults), "faults per replication mode: every one of -kinds once per that many faults, in an order drawn by -seed, the same for every mode")
	fs.StringVar(&kinds, "kinds", strings.Join(PGFaults, ","), "fault kinds: "+strings.Join(PGFaults, ", "))
	fs.StringVar(&modes, "modes", ModeSync+","+ModeAsync, "replication modes, one row each: synchronous (pg_auto_failover's synchronous standby), asynchronous (the consumer commits with synchronous_commit=local)")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the fault schedule")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox chaos -pg-failover: the jetinbox row on a pg_auto_failover formation (monitor,\n"+
			"primary, standby; Debian's "+testenv.AutoFailoverPackages+") while the primary is killed,\n"+
			"failed over and cut off; a row with the standby synchronous and one with asynchronous commits.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Kinds, o.Modes = strings.Split(kinds, ","), strings.Split(modes, ",")
	var errs []error
	for _, k := range o.Kinds {
		if !slices.Contains(PGFaults, k) {
			errs = append(errs, fmt.Errorf("unknown fault %q (known: %s)", k, strings.Join(PGFaults, ", ")))
		}
	}
	for _, m := range o.Modes {
		if m != ModeSync && m != ModeAsync && m != ModeSyncAckOnWarning {
			errs = append(errs, fmt.Errorf("unknown mode %q (known: %s, %s)", m, ModeSync, ModeAsync))
		}
	}
	if o.Intents < 1 || o.Rate < 1 || o.Faults < 0 {
		errs = append(errs, errors.New("-intents and -rate must be at least 1, -faults at least 0"))
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if err := errors.Join(errs...); err != nil {
		return cli.UsageError{Err: fmt.Errorf("chaos -pg-failover: %w", err)}
	}
	if _, _, err := testenv.FindAutoFailover(); err != nil {
		return cli.UsageError{Err: fmt.Errorf("chaos -pg-failover: %w", err)}
	}
	rows, err := RunPGFailover(ctx, o)
	if err != nil {
		return err
	}
	WritePGFailoverTable(stdout, rows)
	for _, r := range rows {
		fmt.Fprintf(stdout, "\nverify on the %s end state:\n", r.Mode)
		r.Verify.WriteTable(stdout)
	}
	for _, r := range rows {
		if r.Mode == ModeSync && !r.Clean() {
			return fmt.Errorf("chaos -pg-failover: synchronous standby: lost %d, duplicated %d, unexpected %d, verify clean %v",
				r.Lost, r.Duplicated, r.Unexpected, r.Verify.Clean())
		}
	}
	return nil
}

// WritePGFailoverTable prints the rows, saying plainly when the
// asynchronous row lost nothing.
func WritePGFailoverTable(w io.Writer, rows []PGFailoverRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "replication\tintents\tunacknowledged\tlost\tapplied once\tduplicated\tunexpected\tdead-lettered\tverify\ttime\tfaults")
	for _, r := range rows {
		v := "clean"
		if r.Verify == nil || !r.Verify.Clean() {
			v = "violations"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%.1fs\t%s\n", r.Mode, r.Intents, r.Unacknowledged, r.Lost, r.AppliedOnce,
			r.Duplicated, r.Unexpected, r.DeadLettered, v, r.Elapsed.Seconds(), r.Faults)
	}
	tw.Flush()
	for _, r := range rows {
		if r.Mode == ModeAsync && r.Lost == 0 {
			fmt.Fprintln(w, "\nThe asynchronous row lost nothing in this run: no fault met a commit the standby did not have yet.")
		}
		if r.Mode == ModeSyncAckOnWarning {
			fmt.Fprintf(w, "\nThe %s row (UNSAFE) acks a commit whose wait for the standby was cancelled, on its warning: it lost %d.\n", r.Mode, r.Lost)
		}
	}
}

// RunPGFailover runs each mode on a formation of its own and returns a
// row per mode.
func RunPGFailover(ctx context.Context, o PGFailoverOptions) ([]PGFailoverRow, error) {
	if len(o.Kinds) == 0 {
		o.Kinds = PGFaults
	}
	if len(o.Modes) == 0 {
		o.Modes = []string{ModeSync, ModeAsync}
	}
	var rows []PGFailoverRow
	for i, m := range o.Modes {
		row, err := runPGMode(ctx, o, m, uint64(i))
		if err != nil {
			return rows, fmt.Errorf("chaos -pg-failover: %s: %w", m, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

type pgRun struct {
	o     PGFailoverOptions
	f     *testenv.AutoFailover
	start time.Time
	mode  string
}

func (r *pgRun) say(format string, a ...any) {
	if r.o.Progress != nil {
		fmt.Fprintf(r.o.Progress, "%6.1fs  %s: %s\n", time.Since(r.start).Seconds(), r.mode, fmt.Sprintf(format, a...))
	}
}

func runPGMode(ctx context.Context, o PGFailoverOptions, mode string, round uint64) (PGFailoverRow, error) {
	r := &pgRun{o: o, start: time.Now(), mode: mode}
	r.say("starting a pg_auto_failover monitor, a primary and a secondary")
	var logs *testenv.LogTail
	logs = testenv.NewLogTail(100)
	f, err := testenv.StartAutoFailover(ctx, testenv.AutoFailoverOptions{Logf: func(format string, a ...any) { fmt.Fprintf(logs, format+"\n", a...) }})
	if err != nil {
		return PGFailoverRow{}, err
	}
	defer f.Close()
	r.f = f
	names, err := f.SyncStandbyNames(ctx)
	if err != nil {
		return PGFailoverRow{}, err
	}
	if names == "" {
		return PGFailoverRow{}, errors.New("pg_auto_failover set no synchronous standby")
	}
	url, err := f.CreateDatabase(ctx, "chaos_failover")
	if err != nil {
		return PGFailoverRow{}, err
	}
	consumerURL := url
	if mode == ModeAsync {
		// The standby stays in synchronous_standby_names, but the
		// consumer's commits wait for the local flush only.
		consumerURL += "&synchronous_commit=local"
	}
	r.say("synchronous_standby_names = %q; consumer URL %s", names, consumerURL)
	n, err := natsenv.StartNATS(natsenv.NATSOptions{})
	if err != nil {
		return PGFailoverRow{}, err
	}
	defer n.Close()
	nc, err := nats.Connect(n.URL(), nats.MaxReconnects(-1))
	if err != nil {
		return PGFailoverRow{}, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// The checks read through a pool of their own, with synchronous commits.
	check, err := pgxpool.New(ctx, url)
	if err != nil {
		return PGFailoverRow{}, err
	}
	defer check.Close()
	if err := pipeline.Setup(ctx, js, check, jsinbox.StreamConfig{}, 64); err != nil {
		return PGFailoverRow{}, err
	}
	// The consumers' pool watches its commits for a cancelled wait for the
	// standby, as the consumer command's does; the unsafe row's does not.
	newPool := pginbox.NewPool
	if mode == ModeSyncAckOnWarning {
		newPool = pgxpool.New
	}
	pool, err := newPool(ctx, consumerURL)
	if err != nil {
		return PGFailoverRow{}, err
	}
	defer pool.Close()
	durable := "ledger"

	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var restarts atomic.Int64
	for w := range 2 {
		wg.Go(func() {
			for wctx.Err() == nil {
				if err := r.worker(wctx, js, pool, durable, w); err != nil && wctx.Err() == nil {
					restarts.Add(1)
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	defer func() { stopWorkers(); wg.Wait() }()

	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{AckTimeout: 2 * time.Second, MaxInFlight: 256,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 50 * time.Millisecond, Cap: time.Second, MaxElapsed: time.Minute}})
	if err != nil {
		return PGFailoverRow{}, err
	}
	defer pub.Close()
	intents := pipeline.Generate(pipeline.Load{Count: o.Intents, Accounts: 64, Prefix: "pgf-" + mode, Seed: o.Seed + round})
	schedule := pgSchedule(o)
	// Fault k goes in once (k+1)/(faults+1) of the intents are out, while
	// the producer goes on publishing and the consumers on committing; the
	// producer waits at the next fault's mark until this one is over, so
	// that every fault meets intents in flight.
	var published atomic.Int64
	var notes []string
	mark := func(k int) int { return len(intents) * (k + 1) / (len(schedule) + 1) }
	faultDone := make([]chan struct{}, len(schedule))
	for k := range faultDone {
		faultDone[k] = make(chan struct{})
	}
	faultErr := make(chan error, 1)
	go func() {
		for k, kind := range schedule {
			for published.Load() < int64(mark(k)) && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
			fctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			note, err := r.fault(fctx, kind)
			cancel()
			if err != nil {
				r.say("pg_autoctl's last lines:\n%s", logs)
				faultErr <- fmt.Errorf("%s: %w", kind, err)
				return
			}
			notes = append(notes, note)
			r.say("%s", note)
			close(faultDone[k])
		}
		faultErr <- nil
	}()
	tick := time.NewTicker(time.Second / time.Duration(o.Rate))
	defer tick.Stop()
	next := 1 // the next fault whose mark makes the producer wait for the one before
	for i, in := range intents {
		if next < len(schedule) && i == mark(next) {
			select {
			case <-faultDone[next-1]:
			case err := <-faultErr:
				if err == nil {
					err = errors.New("the faults ended early")
				}
				return PGFailoverRow{}, err
			}
			next++
		}
		<-tick.C
		if err := pub.PublishAsync(ctx, in); err != nil {
			return PGFailoverRow{}, err
		}
		published.Add(1)
	}
	if err := <-faultErr; err != nil {
		return PGFailoverRow{}, err
	}
	if err := pub.Flush(ctx); err != nil {
		return PGFailoverRow{}, err
	}
	r.say("everything published; waiting for the consumers to settle the stream")
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	err = pipeline.WaitSettled(sctx, js, jsinbox.DefaultStream, durable, nil)
	cancel()
	stopWorkers()
	wg.Wait()
	if err != nil {
		return PGFailoverRow{}, err
	}
	row := PGFailoverRow{Mode: mode, Intents: len(intents), Elapsed: time.Since(r.start), Faults: strings.Join(notes, "; ")}
	if len(notes) == 0 {
		row.Faults = "none"
	}
	if err := countPG(ctx, check, js, intents, pub.Failures(), &row); err != nil {
		return PGFailoverRow{}, err
	}
	if row.Verify, err = verify.Run(ctx, js, check, verify.Options{Scope: effects.DefaultScope, Durable: durable, Ledger: true}); err != nil {
		return PGFailoverRow{}, err
	}
	r.say("lost %d, applied once %d, duplicated %d, unexpected %d; %d consumer restarts", row.Lost, row.AppliedOnce, row.Duplicated, row.Unexpected, restarts.Load())
	return row, nil
}

// worker runs one inbox consumer until it stops.
func (r *pgRun) worker(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, durable string, w int) error {
	logger := r.o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	proc, err := inbox.NewProcessor(pginbox.New(pool), effects.NewLedger(), inbox.Config{Scope: effects.DefaultScope, Logger: logger.With("consumer", w+1)})
	if err != nil {
		return err
	}
	c, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{Durable: durable, BatchSize: 50, AckWait: 5 * time.Second,
		MaxDeliver: 100})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// fault applies one fault, waits until the formation has a primary and a
// secondary again, and says what happened.
func (r *pgRun) fault(ctx context.Context, kind string) (string, error) {
	p, err := r.f.WaitPrimary(ctx, 2*time.Minute)
	if err != nil {
		return "", err
	}
	if p < 0 {
		return "", errors.New("no primary")
	}
	t0 := time.Now()
	switch kind {
	case "kill-primary":
		r.f.KillNode(p)
		if err := r.waitPrimary(ctx, 1-p); err != nil {
			return "", err
		}
		promoted := time.Since(t0)
		if err := r.f.StartNode(p); err != nil {
			return "", err
		}
		if err := r.f.WaitStates(ctx, 2*time.Minute, "primary", "secondary"); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s killed, %s promoted in %.1fs, %s rejoined as secondary", r.f.Name(p), r.f.Name(1-p), promoted.Seconds(), r.f.Name(p)), nil
	case "lag-then-kill":
		release, err := r.f.PauseWALReceiver(ctx, 1-p)
		if err != nil {
			return "", err
		}
		time.Sleep(time.Second)
		promoted, err := r.killStalledPrimary(ctx, p, release, t0)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s's WAL receiver stalled 1s, %s killed with it, %s promoted after %.1fs, %s rejoined as secondary", r.f.Name(1-p), r.f.Name(p), r.f.Name(1-p), promoted.Seconds(), r.f.Name(p)), nil
	case "failover":
		if err := r.f.PerformFailover(ctx); err != nil {
			return "", err
		}
		if err := r.f.WaitStates(ctx, 2*time.Minute, "primary", "secondary"); err != nil {
			return "", err
		}
		return fmt.Sprintf("perform failover: %s → %s in %.1fs", r.f.Name(p), r.f.Name(1-p), time.Since(t0).Seconds()), nil
	case "kill-postgres":
		if err := r.f.KillPostgres(p); err != nil {
			return "", err
		}
		time.Sleep(time.Second) // the keeper notices and restarts it
		if err := r.f.WaitStates(ctx, 2*time.Minute, "primary", "secondary"); err != nil {
			return "", err
		}
		q, _ := r.f.Primary(ctx)
		return fmt.Sprintf("%s's postgres SIGKILLed, primary now %s after %.1fs", r.f.Name(p), r.f.Name(q), time.Since(t0).Seconds()), nil
	case "cancel-sync-wait":
		release, err := r.f.PauseWALReceiver(ctx, 1-p)
		if err != nil {
			return "", err
		}
		canceller, err := testenv.StartSyncRepCanceller(ctx, r.f.NodeURL(p, "postgres"), 500*time.Millisecond)
		if err != nil {
			release(false)
			return "", err
		}
		time.Sleep(3 * time.Second)
		cancelled, err := canceller.Stop()
		if err != nil {
			release(false)
			return "", err
		}
		promoted, err := r.killStalledPrimary(ctx, p, release, t0)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s's WAL receiver stalled 3s, %d waiting commits cancelled, %s killed, %s promoted after %.1fs, %s rejoined as secondary",
			r.f.Name(1-p), cancelled, r.f.Name(p), r.f.Name(1-p), promoted.Seconds(), r.f.Name(p)), nil
	case "cut":
		r.f.Cut(p)
		time.Sleep(2 * time.Second)
		if err := r.f.Mend(p); err != nil {
			return "", err
		}
		return fmt.Sprintf("clients cut from %s for 2s", r.f.Name(p)), nil
	}
	return "", fmt.Errorf("unknown fault %q", kind)
}

func (r *pgRun) waitPrimary(ctx context.Context, want int) error {
	for {
		if p, err := r.f.Primary(ctx); err == nil && p == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not promoted: %w", r.f.Name(want), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// countPG counts per intent, from the ledger and the dead letters.
func countPG(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, intents []inbox.Intent, failures []jsinbox.Failure, row *PGFailoverRow) error {
	applied, err := appliedPG(ctx, pool)
	if err != nil {
		return err
	}
	return countApplied(ctx, js, intents, failures, applied, row)
}

// appliedPG counts the ledger entries per message ID.
func appliedPG(ctx context.Context, pool *pgxpool.Pool) (map[string]int, error) {
	applied := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT message_id, count(*) FROM ledger_entries GROUP BY message_id`)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		applied[id] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	return applied, nil
}

// countApplied counts per intent, from the ledger entries per message ID
// (whatever store they were read from) and the dead letters.
func countApplied(ctx context.Context, js jetstream.JetStream, intents []inbox.Intent, failures []jsinbox.Failure, applied map[string]int, row *PGFailoverRow) error {
	published := map[string]bool{}
	for _, in := range intents {
		published[in.ID] = true
	}
	failed := map[string]bool{}
	for _, f := range failures {
		failed[f.ID] = true
	}
	for id := range applied {
		if !published[id] {
			row.Unexpected++
		}
	}
	dead := map[string]bool{}
	dls, err := verify.ReadStream(ctx, js, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	for _, d := range dls {
		dead[d.Header[jsinbox.HeaderMessageID]] = true
	}
	for _, in := range intents {
		switch n := applied[in.ID]; {
		case n == 1:
			row.AppliedOnce++
		case n > 1:
			row.Duplicated++
		case dead[in.ID]:
			row.DeadLettered++
		case failed[in.ID]:
			row.Unacknowledged++
		default:
			row.Lost++
		}
	}
	return nil
}

// pgSchedule is the faults of a mode, in order: every kind once per
// len(Kinds) faults, shuffled by the seed alone, so that every mode meets
// the same schedule and the rows compare replication, not luck.
func pgSchedule(o PGFailoverOptions) []string {
	dice := rand.New(rand.NewPCG(o.Seed, 0))
	var schedule []string
	for len(schedule) < o.Faults {
		kinds := slices.Clone(o.Kinds)
		dice.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		schedule = append(schedule, kinds[:min(len(kinds), o.Faults-len(schedule))]...)
	}
	return schedule
}

// killStalledPrimary kills primary p while its standby's WAL receiver is
// stalled (release(true) drops what was on the wire, dying with the
// primary), waits for the standby's promotion, and restarts p as the new
// secondary. It returns how long after t0 the promotion came.
func (r *pgRun) killStalledPrimary(ctx context.Context, p int, release func(drop bool), t0 time.Time) (time.Duration, error) {
	r.f.KillNode(p)
	release(true)
	if err := r.waitPrimary(ctx, 1-p); err != nil {
		return 0, err
	}
	promoted := time.Since(t0)
	if err := r.f.StartNode(p); err != nil {
		return 0, err
	}
	if err := r.f.WaitStates(ctx, 2*time.Minute, "primary", "secondary"); err != nil {
		return 0, err
	}
	return promoted, nil
}
