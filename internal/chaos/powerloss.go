// The jetinbox row under power loss: every server keeps its data on a
// filesystem that forgets what was not fsynced, and on a seeded schedule
// the power goes out while intents are published and consumed. One row per
// configuration: the shipped settings must lose nothing; the unsafe ones
// show what they lose, in the same run.

package chaos

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/powerfs"
	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
)

// PowerRowSpec is one configuration of a power-loss run.
type PowerRowSpec struct {
	// Name is what -rows takes.
	Name string
	// Settings says, for the table, what runs unsafely or as shipped.
	Settings string
	// Shipped rows must lose nothing; the others are expected to.
	Shipped bool
	// Nodes is 1, or 3 for an R3 stream on three nodes.
	Nodes int
	// OneNode cuts the power of one nats-server node at a time (its
	// process and its filesystem), while everything else runs.
	OneNode bool
	// SQLite runs one consumer on a SQLite file instead of two on
	// PostgreSQL.
	SQLite bool
	// SyncInterval is the nats-server's sync_interval: "always", or ""
	// for the server's default (two minutes).
	SyncInterval string
	// PGSettings are PostgreSQL settings on top of fsync on.
	PGSettings []string
	// SQLiteNormal opens the SQLite file with synchronous=NORMAL.
	SQLiteNormal bool
	// PartitionOther, in a one-node row, cuts the routes between another
	// node and the stream leader before the power goes out, and heals
	// them once the node is back.
	PartitionOther bool
	// Damage replaces the power cut: one node is killed, its newest .blk
	// file of the intents stream is damaged while it is down (bits
	// flipped, or the file truncated, by turns, truncated first), and it
	// starts again on it.
	Damage bool
}

// PowerRows are the configurations of a power-loss run, in table order.
var PowerRows = []PowerRowSpec{
	{Name: "shipped-pg", Shipped: true, Nodes: 1, SyncInterval: "always",
		Settings: "1 node; nats sync_interval always; PostgreSQL fsync on, synchronous_commit on"},
	{Name: "shipped-sqlite", Shipped: true, Nodes: 1, SyncInterval: "always", SQLite: true,
		Settings: "1 node; nats sync_interval always; SQLite WAL, synchronous=FULL"},
	{Name: "shipped-r3", Shipped: true, Nodes: 3, SyncInterval: "always",
		Settings: "R3, all nodes, PostgreSQL and consumers lose power together; sync_interval always; fsync, synchronous_commit on"},
	{Name: "shipped-r3-one", Shipped: true, Nodes: 3, SyncInterval: "always", OneNode: true,
		Settings: "R3, one node loses power at a time, the rest runs; sync_interval always; fsync, synchronous_commit on"},
	{Name: "shipped-r3-one-partitioned", Shipped: true, Nodes: 3, SyncInterval: "always", OneNode: true, PartitionOther: true,
		Settings: "R3, one node loses power while another is cut off from the stream leader; sync_interval always; fsync, synchronous_commit on"},
	{Name: "shipped-r3-damaged-blk", Shipped: true, Nodes: 3, SyncInterval: "always", Damage: true,
		Settings: "R3, one node's newest .blk of the stream truncated or bit-flipped while it is down; sync_interval always"},
	{Name: "unsafe-nats-sync", Nodes: 1,
		Settings: "UNSAFE: 1 node; nats default sync_interval (2m); PostgreSQL as shipped"},
	{Name: "unsafe-pg-commit", Nodes: 1, SyncInterval: "always", PGSettings: []string{"synchronous_commit=off"},
		Settings: "UNSAFE: 1 node; PostgreSQL synchronous_commit=off (fsync on, wal_writer_delay default); nats as shipped"},
	{Name: "unsafe-sqlite-normal", Nodes: 1, SyncInterval: "always", SQLite: true, SQLiteNormal: true,
		Settings: "UNSAFE: 1 node; SQLite WAL, synchronous=NORMAL; nats as shipped"},
	{Name: "unsafe-r3-nats-sync", Nodes: 3,
		Settings: "UNSAFE: R3, all nodes, PostgreSQL and consumers lose power together; nats default sync_interval (2m)"},
	{Name: "unsafe-r1-damaged-blk", Nodes: 1, SyncInterval: "always", Damage: true,
		Settings: "UNSAFE: R1, the node's newest .blk of the stream truncated or bit-flipped while it is down; sync_interval always"},
}

// PowerOptions configures a power-loss run.
type PowerOptions struct {
	// Rows to run, by name (default: every one of PowerRows).
	Rows []string
	// Cuts is how many times the power goes out per row.
	Cuts int
	// Intents published per row.
	Intents int
	// Rate paces the producer between bursts (intents per second).
	Rate int
	// Burst is how many intents go out unpaced right before each cut.
	Burst int
	// Seed draws the cut delays, the nodes of the one-node row and the
	// torn writes.
	Seed uint64
	// Tear tears the last unsynced write of each file at a page boundary
	// instead of dropping it whole.
	Tear bool
	// Settle bounds the wait for the consumers to drain after the load.
	Settle time.Duration
	// Progress, if set, gets a line per step.
	Progress io.Writer
	// Verbose also copies the servers' and consumers' logs to Progress.
	Verbose bool
}

// PowerRow is one configuration's result, counted per intent as the
// cluster run counts: lost is acknowledged to the producer and neither
// applied nor dead-lettered.
type PowerRow struct {
	Spec           PowerRowSpec
	Cuts           int
	Published      int
	Unacknowledged int
	AppliedOnce    int
	Duplicated     int
	DeadLettered   int
	Lost           int
	Unexpected     int
	Verify         *verify.Report
	Elapsed        time.Duration
	// Notes say what happened: what each cut dropped, a drain that did
	// not finish.
	Notes []string
	// Err is a failure of the row's run itself (a server that did not
	// come back, a drain that timed out): the row counts what it could.
	Err error
}

// Acked is how many intents the producer saw acknowledged.
func (r PowerRow) Acked() int { return r.Published - r.Unacknowledged }

// Clean reports lost, duplicated and unexpected all 0, every acked intent
// applied or dead-lettered, verify clean and the run whole.
func (r PowerRow) Clean() bool {
	return r.Err == nil && r.Lost == 0 && r.Duplicated == 0 && r.Unexpected == 0 && r.Verify != nil && r.Verify.Clean()
}

// PowerLossMain is `jetinbox chaos -power-loss`: its own flags.
func PowerLossMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox chaos -power-loss", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := PowerOptions{Progress: stderr}
	var names []string
	for _, s := range PowerRows {
		names = append(names, s.Name)
	}
	var rows string
	fs.IntVar(&o.Cuts, "cuts", 3, "power cuts per row")
	fs.IntVar(&o.Intents, "intents", 2000, "intents published per row")
	fs.IntVar(&o.Rate, "rate", 400, "intents per second the producer publishes between bursts")
	fs.IntVar(&o.Burst, "burst", 200, "intents published unpaced right before each cut: the power goes out with them acknowledged and in flight to the consumers")
	fs.StringVar(&rows, "rows", strings.Join(names, ","), "rows to run: "+strings.Join(names, ", "))
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the cut delays, the nodes of shipped-r3-one and the torn writes")
	fs.BoolVar(&o.Tear, "tear", false, "tear the last unsynced write of each file at a page boundary instead of dropping it whole")
	fs.DurationVar(&o.Settle, "settle", 3*time.Minute, "longest wait for the consumers to drain after the load")
	fs.BoolVar(&o.Verbose, "v", false, "also print the servers' and consumers' logs")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox chaos -power-loss: the jetinbox row while the power goes out. Every server keeps its\n"+
			"data on a FUSE filesystem that forgets what was not fsynced; at each cut every process gets SIGKILL\n"+
			"(nats-server, PostgreSQL, the consumers), the filesystems drop their unsynced writes and everything\n"+
			"restarts on what is left. One row per configuration: the shipped settings must lose nothing, the\n"+
			"unsafe ones show what they lose. The damaged-blk rows kill a node instead and truncate or flip bits\n"+
			"in its newest .blk file of the stream before it starts again. Needs root and /dev/fuse (Debian's fuse3).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Rows = strings.Split(rows, ",")
	var errs []error
	for _, r := range o.Rows {
		if !slices.Contains(names, r) {
			errs = append(errs, fmt.Errorf("unknown row %q (known: %s)", r, strings.Join(names, ", ")))
		}
	}
	if o.Cuts < 1 || o.Intents < 1 || o.Rate < 1 || o.Burst < 0 || o.Settle <= 0 {
		errs = append(errs, errors.New("-cuts, -intents and -rate must be at least 1, -burst at least 0, -settle positive"))
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if err := errors.Join(errs...); err != nil {
		return cli.UsageError{Err: fmt.Errorf("chaos -power-loss: %w", err)}
	}
	start := time.Now()
	res, err := RunPowerLoss(ctx, o)
	if err != nil {
		return err
	}
	WritePowerTable(stdout, res)
	fmt.Fprintf(stdout, "\n%d rows, %d cuts each, %d intents each, seed %d: %.0fs\n", len(res), o.Cuts, o.Intents, o.Seed, time.Since(start).Seconds())
	var bad []string
	for _, r := range res {
		if r.Spec.Shipped && !r.Clean() {
			bad = append(bad, r.Spec.Name)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("chaos -power-loss: shipped rows not clean: %s", strings.Join(bad, ", "))
	}
	return nil
}

// WritePowerTable prints the rows, then each row's notes, saying plainly
// when an unsafe row lost nothing.
func WritePowerTable(w io.Writer, rows []PowerRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "row\tpower cuts\tpublished\tacked\tapplied\tdead-lettered\tlost\tduplicated\tunexpected\tverify\ttime\tsettings")
	for _, r := range rows {
		v := "clean"
		switch {
		case r.Verify == nil:
			v = "not run"
		case !r.Verify.Clean():
			v = "violations"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%.1fs\t%s\n", r.Spec.Name, r.Cuts, r.Published, r.Acked(), r.AppliedOnce,
			r.DeadLettered, r.Lost, r.Duplicated, r.Unexpected, v, r.Elapsed.Seconds(), r.Spec.Settings)
	}
	tw.Flush()
	for _, r := range rows {
		fmt.Fprintf(w, "\n%s:", r.Spec.Name)
		switch {
		case r.Err != nil:
			fmt.Fprintf(w, " RUN FAILED: %v", r.Err)
		case r.Spec.Shipped && r.Clean():
			fmt.Fprint(w, " clean")
		case r.Spec.Shipped:
			fmt.Fprint(w, " NOT CLEAN")
		case r.Lost == 0 && r.Verify != nil && !r.Verify.Clean():
			fmt.Fprintf(w, " every acknowledged intent was applied, but the stream lost messages: verify reports %d violations (%d inbox rows and effects whose message is gone, %d messages never applied)",
				r.Verify.ViolationCount(), r.Verify.Unexpected, r.Verify.Lost)
		case r.Lost == 0:
			fmt.Fprint(w, " no loss seen this run")
		default:
			fmt.Fprintf(w, " lost %d of %d acknowledged intents (%.1f%%)", r.Lost, r.Acked(), 100*float64(r.Lost)/float64(max(r.Acked(), 1)))
		}
		fmt.Fprintln(w)
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
}

// RunPowerLoss runs each row on a stack of its own and returns a row per
// configuration. A row whose run failed carries its error; the others
// still run.
func RunPowerLoss(ctx context.Context, o PowerOptions) ([]PowerRow, error) {
	specs := PowerRows
	if o.Settle <= 0 {
		o.Settle = 3 * time.Minute
	}
	if o.Rate <= 0 {
		o.Rate = 400
	}
	var rows []PowerRow
	for i, s := range specs {
		if len(o.Rows) > 0 && !slices.Contains(o.Rows, s.Name) {
			continue
		}
		row := runPowerRow(ctx, o, s, uint64(i))
		rows = append(rows, row)
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
	}
	return rows, nil
}

// powerStack is one row's servers: every one on a powerfs mount of its
// own, as separate processes the power cut kills.
type powerStack struct {
	o     PowerOptions
	spec  PowerRowSpec
	start time.Time
	logs  *testenv.LogTail

	base   string
	mounts map[string]*powerfs.FS
	nats   *natsenv.NATSProcs
	pg     *testenv.Postgres
	dbURL  string // what the consumers open

	consumers []*powerConsumer
	// damages counts the damage rows' cuts: odd ones truncate, even ones
	// flip bits.
	damages int
}

func (s *powerStack) say(format string, a ...any) {
	if s.o.Progress != nil {
		fmt.Fprintf(s.o.Progress, "%6.1fs  %s: %s\n", time.Since(s.start).Seconds(), s.spec.Name, fmt.Sprintf(format, a...))
	}
}

func (s *powerStack) logf(format string, a ...any) {
	line := fmt.Sprintf(format, a...)
	fmt.Fprintln(s.logs, line)
	if s.o.Verbose && s.o.Progress != nil {
		fmt.Fprintf(s.o.Progress, "        %s: %s\n", s.spec.Name, strings.TrimRight(line, "\n"))
	}
}

// nodeMount names node i's mount.
func nodeMount(i int) string { return fmt.Sprintf("n%d", i+1) }

// runPowerRow runs one configuration: up, load with cuts, drain, count.
func runPowerRow(ctx context.Context, o PowerOptions, spec PowerRowSpec, round uint64) PowerRow {
	s := &powerStack{o: o, spec: spec, start: time.Now(), logs: testenv.NewLogTail(300), mounts: map[string]*powerfs.FS{}}
	row := PowerRow{Spec: spec}
	defer s.close()
	err := s.run(ctx, &row, round)
	row.Elapsed = time.Since(s.start)
	if err != nil {
		row.Err = err
		s.say("failed: %v; the last log lines:\n%s", err, s.logs)
	}
	return row
}

func (s *powerStack) run(ctx context.Context, row *PowerRow, round uint64) error {
	var err error
	if s.base, err = os.MkdirTemp("", "jetinbox-power-"); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	// PostgreSQL runs as the postgres user and must reach its mount.
	if err := os.Chmod(s.base, 0o755); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	names := []string{}
	for i := range s.spec.Nodes {
		names = append(names, nodeMount(i))
	}
	if s.spec.SQLite {
		names = append(names, "sqlite")
	} else {
		names = append(names, "pg")
	}
	for _, n := range names {
		backing, mnt := filepath.Join(s.base, "backing", n), filepath.Join(s.base, "mnt", n)
		for _, d := range []string{backing, mnt} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("chaos: %w", err)
			}
		}
		if n == "sqlite" {
			// This process serves the mount and must not use SQLite
			// through it: SQLite maps its WAL index, and a page fault on
			// a mapping the same Go process serves can stall the runtime
			// (the thread in the fault cannot stop for the collector,
			// which holds back the goroutines that would answer it). The
			// file is made in the backing directory before the mount, as
			// an installed, synced file, and read there after it.
			if err := setupSQLite(ctx, filepath.Join(backing, sqliteFile)); err != nil {
				return err
			}
		}
		m, err := powerfs.Mount(backing, mnt, powerfs.Options{AllowOther: true})
		if err != nil {
			return fmt.Errorf("chaos: mount %s: %w", n, err)
		}
		s.mounts[n] = m
	}
	var stores []string
	for i := range s.spec.Nodes {
		stores = append(stores, s.mounts[nodeMount(i)].Dir())
	}
	if s.nats, err = natsenv.StartNATSProcs(ctx, natsenv.NATSProcsOptions{Nodes: s.spec.Nodes, StoreDirs: stores, SyncInterval: s.spec.SyncInterval, Logf: s.logf}); err != nil {
		return err
	}
	if err := s.waitHealthy(ctx); err != nil {
		return err
	}
	nc, err := nats.Connect(strings.Join(s.natsURLs(), ","), nats.Name("chaos-power-producer"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.ReconnectJitter(50*time.Millisecond, 50*time.Millisecond),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		return fmt.Errorf("chaos: connect: %w", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	streamCfg := jsinbox.StreamConfig{Replicas: s.spec.Nodes}
	if s.spec.SQLite {
		s.dbURL = "sqlite://" + filepath.Join(s.mounts["sqlite"].Dir(), sqliteFile)
		err = retrySetup(ctx, func(ctx context.Context) error { _, err := jsinbox.EnsureStream(ctx, js, streamCfg); return err })
	} else {
		if s.pg, err = testenv.StartPostgres(ctx, testenv.PostgresOptions{Dir: s.mounts["pg"].Dir(), Durable: true, Settings: s.spec.PGSettings, Logf: s.logf}); err != nil {
			return err
		}
		if s.dbURL, err = s.pg.CreateDatabase(ctx, "chaos_power"); err != nil {
			return err
		}
		pool, perr := pginbox.NewPool(ctx, s.dbURL)
		if perr != nil {
			return fmt.Errorf("chaos: %w", perr)
		}
		err = retrySetup(ctx, func(ctx context.Context) error { return pipeline.Setup(ctx, js, pool, streamCfg, 64) })
		pool.Close() // the count opens a pool of its own, on the server as the cuts left it
	}
	if err != nil {
		return err
	}
	n := 2
	if s.spec.SQLite {
		n = 1 // one writer per file
	}
	for w := range n {
		c := s.newConsumer(w)
		s.consumers = append(s.consumers, c)
		go c.supervise(ctx)
	}
	if err := waitDurable(ctx, js, jsinbox.DefaultStream, powerDurable); err != nil {
		return err
	}
	// The installation is durable before the run, as initdb (without
	// --no-sync), a migration and a stream's creation leave it: only what
	// the run writes is at stake.
	for name, m := range s.mounts {
		if err := syncTree(m.Dir()); err != nil {
			return fmt.Errorf("chaos: sync %s: %w", name, err)
		}
	}
	s.say("up: %d node(s), %s, %d consumer process(es); every store on powerfs", s.spec.Nodes, s.storeName(), n)

	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{AckTimeout: 2 * time.Second, MaxInFlight: 256,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 50 * time.Millisecond, Cap: 2 * time.Second, MaxElapsed: 2 * time.Minute}})
	if err != nil {
		return err
	}
	defer pub.Close()
	intents := pipeline.Generate(pipeline.Load{Count: s.o.Intents, Accounts: 64, Prefix: "power-" + s.spec.Name, Seed: s.o.Seed + round})
	row.Published = len(intents)
	if err := s.load(ctx, pub, intents, row, round); err != nil {
		return err
	}
	s.say("everything published; waiting for the consumers to drain")
	// WaitSettled bounds each look on its own, so a request a cluster just
	// back from a cut dropped does not hold the wait.
	sctx, scancel := context.WithTimeout(ctx, s.o.Settle)
	settleErr := pipeline.WaitSettled(sctx, js, jsinbox.DefaultStream, powerDurable, nil)
	scancel()
	for _, c := range s.consumers {
		c.stop()
	}
	if settleErr != nil {
		// Count anyway: an unsafe row's stream can be left in a state that
		// never drains, and what it lost is the point.
		row.Notes = append(row.Notes, fmt.Sprintf("the consumers did not drain within %v", s.o.Settle))
		if s.spec.Shipped {
			row.Err = settleErr
		}
	}
	var db verify.DB
	var applied map[string]int
	if s.spec.SQLite {
		// Unmounted once the consumers are gone (see above), the file is
		// read in the backing directory.
		if err := s.mounts["sqlite"].Close(); err != nil {
			return fmt.Errorf("chaos: unmount sqlite: %w", err)
		}
		sdb, err := sqliteinbox.Open(ctx, filepath.Join(s.base, "backing", "sqlite", sqliteFile))
		if err != nil {
			return err
		}
		defer sdb.Close()
		db = verify.SQLite(sdb)
		applied, err = appliedSQLite(ctx, sdb)
		if err != nil {
			return err
		}
	} else {
		pool, err := pginbox.NewPool(ctx, s.dbURL)
		if err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
		defer pool.Close()
		db = verify.Postgres(pool)
		if applied, err = appliedPG(ctx, pool); err != nil {
			return err
		}
	}
	var c PGFailoverRow
	if err := countApplied(ctx, js, intents, pub.Failures(), applied, &c); err != nil {
		return err
	}
	row.Unacknowledged, row.AppliedOnce, row.Duplicated, row.DeadLettered, row.Lost, row.Unexpected = c.Unacknowledged, c.AppliedOnce, c.Duplicated, c.DeadLettered, c.Lost, c.Unexpected
	if row.Verify, err = verify.RunOn(ctx, js, db, verify.Options{Scope: effects.DefaultScope, Durable: powerDurable, Ledger: true}); err != nil {
		return err
	}
	if s.spec.Damage {
		row.Notes = append(row.Notes, fmt.Sprintf("verify on the end state: %d stream messages; %d inbox rows and ledger entries whose stream message is gone (unexpected), %d stream messages neither applied nor dead-lettered (lost), %d duplicated, %d balance mismatches",
			row.Verify.StreamMessages, row.Verify.Unexpected, row.Verify.Lost, row.Verify.Duplicated, row.Verify.BalanceMismatches))
	}
	var restarts int
	for _, c := range s.consumers {
		restarts += c.restarts()
	}
	st := pub.Stats()
	row.Notes = append(row.Notes, fmt.Sprintf("publish retries %d, duplicates dropped by the stream %d; consumer processes restarted %d times outside the cuts", st.Retries, st.Duplicates, restarts))
	s.say("lost %d, applied once %d, duplicated %d, unexpected %d, dead-lettered %d, unacknowledged %d; verify clean %v",
		row.Lost, row.AppliedOnce, row.Duplicated, row.Unexpected, row.DeadLettered, row.Unacknowledged, row.Verify.Clean())
	return row.Err
}

// powerDurable is the consumers' durable.
const powerDurable = "ledger"

// sqliteFile is the SQLite file's name on its mount.
const sqliteFile = "ledger.db"

func (s *powerStack) storeName() string {
	switch {
	case s.spec.SQLite && s.spec.SQLiteNormal:
		return "SQLite (synchronous=NORMAL)"
	case s.spec.SQLite:
		return "SQLite"
	}
	return "PostgreSQL"
}

func (s *powerStack) natsURLs() []string {
	var u []string
	for i := range s.spec.Nodes {
		u = append(u, s.nats.URL(i))
	}
	return u
}

func (s *powerStack) waitHealthy(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return s.nats.WaitHealthy(wctx)
}

// load publishes the intents: paced, but for a burst right before each
// cut; once the burst is acknowledged the power goes out after a seeded
// few milliseconds, while the consumers still work on it and the producer
// goes on with the next intents, which meet the outage in flight.
func (s *powerStack) load(ctx context.Context, pub *jsinbox.Publisher, intents []inbox.Intent, row *PowerRow, round uint64) error {
	dice := rand.New(rand.NewPCG(s.o.Seed, round))
	nodes := dice.Perm(max(s.spec.Nodes, 1))
	tick := time.NewTicker(time.Second / time.Duration(s.o.Rate))
	defer tick.Stop()
	segs := s.o.Cuts + 1
	var cutDone chan error
	for k := range segs {
		seg := intents[len(intents)*k/segs : len(intents)*(k+1)/segs]
		burst := 0
		if k < s.o.Cuts {
			burst = min(s.o.Burst, len(seg)/2)
		}
		for i, in := range seg {
			if i < len(seg)-burst {
				<-tick.C
			}
			if err := pub.PublishAsync(ctx, in); err != nil {
				return err
			}
		}
		if k == s.o.Cuts {
			break
		}
		// The previous cut must be over before the next one.
		if cutDone != nil {
			if err := <-cutDone; err != nil {
				return err
			}
		}
		if err := pub.Flush(ctx); err != nil {
			return err
		}
		delay := time.Duration(dice.Int64N(int64(10 * time.Millisecond)))
		node := nodes[k%len(nodes)]
		seed := dice.Uint64()
		cutDone = make(chan error, 1)
		go func() {
			time.Sleep(delay)
			note, err := s.cut(ctx, node, seed)
			if err == nil {
				row.Cuts++
				row.Notes = append(row.Notes, fmt.Sprintf("cut %d, %v after a burst of %d was acknowledged: %s", row.Cuts, delay.Round(time.Millisecond), burst, note))
				s.say("%s", note)
			}
			cutDone <- err
		}()
	}
	if cutDone != nil {
		if err := <-cutDone; err != nil {
			return err
		}
	}
	return pub.Flush(ctx)
}

// cut takes the power away: from every process of the stack at once, or,
// in a one-node row, from one nats-server node; then every mount it hit
// drops what was not synced, and everything starts again on what is left.
func (s *powerStack) cut(ctx context.Context, node int, seed uint64) (string, error) {
	t0 := time.Now()
	if s.spec.Damage {
		return s.damage(ctx, node, seed)
	}
	if s.spec.OneNode && s.spec.PartitionOther {
		return s.cutPartitioned(ctx, node, seed)
	}
	if s.spec.OneNode {
		if err := s.nats.Kill(node); err != nil {
			return "", err
		}
		m := nodeMount(node)
		st, err := s.mounts[m].Crash(powerfs.CrashOptions{Tear: s.o.Tear, Seed: int64(seed)})
		if err != nil {
			return "", fmt.Errorf("crash %s: %w", m, err)
		}
		if err := s.nats.Start(node); err != nil {
			return "", fmt.Errorf("restart n%d: %w", node+1, err)
		}
		if err := s.waitHealthy(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf("n%d lost power (%s: %s), back after %.1fs", node+1, m, st, time.Since(t0).Seconds()), nil
	}
	// Every process at once, as the power takes them.
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.nats.KillAll() })
	if s.pg != nil {
		wg.Go(func() { _ = s.pg.KillAll() })
	}
	for _, c := range s.consumers {
		wg.Go(c.kill)
	}
	wg.Wait()
	var dropped []string
	for _, name := range slices.Sorted(maps.Keys(s.mounts)) {
		st, err := s.mounts[name].Crash(powerfs.CrashOptions{Tear: s.o.Tear, Seed: int64(seed)})
		if err != nil {
			return "", fmt.Errorf("crash %s: %w", name, err)
		}
		dropped = append(dropped, fmt.Sprintf("%s: %s", name, st))
	}
	if s.pg != nil {
		if err := s.pg.Start(ctx); err != nil {
			return "", fmt.Errorf("PostgreSQL after the cut: %w", err)
		}
	}
	errs := make([]error, s.spec.Nodes)
	for i := range s.spec.Nodes {
		wg.Go(func() { errs[i] = s.nats.Start(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "", fmt.Errorf("nats-server after the cut: %w", err)
	}
	if err := s.waitHealthy(ctx); err != nil {
		return "", err
	}
	for _, c := range s.consumers {
		c.release()
	}
	return fmt.Sprintf("every process killed, unsynced writes dropped (%s), back after %.1fs", strings.Join(dropped, "; "), time.Since(t0).Seconds()), nil
}

// close stops everything and removes the mounts and their files.
func (s *powerStack) close() {
	for _, c := range s.consumers {
		c.end()
	}
	if s.pg != nil {
		_ = s.pg.Close()
	}
	if s.nats != nil {
		s.nats.Close()
	}
	for _, m := range s.mounts {
		_ = m.Close()
	}
	if s.base != "" {
		_ = os.RemoveAll(s.base)
	}
}

// setupSQLite migrates the SQLite file and seeds its accounts.
func setupSQLite(ctx context.Context, path string) error {
	st, err := cli.OpenStore(ctx, "sqlite://"+path, 1, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	if _, _, err := st.Migrate(ctx); err != nil {
		return err
	}
	return st.SeedAccounts(ctx, 64)
}

// retrySetup retries setup while a fresh cluster places its first stream.
func retrySetup(ctx context.Context, setup func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		err := setup(actx)
		acancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: setup: %w (last error: %w)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitDurable waits until the consumers created their durable.
func waitDurable(ctx context.Context, js jetstream.JetStream, stream, durable string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		// Each lookup its own timeout: a request the cluster dropped
		// while it elected must not use up the whole wait.
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.Consumer(actx, stream, durable)
		acancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: no durable %s: %w (last error: %w)", durable, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// syncTree fsyncs every file and directory under dir.
func syncTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // a file the server removed meanwhile
			}
			return err
		}
		if !d.Type().IsRegular() && !d.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}

// appliedSQLite counts the ledger entries per message ID in a SQLite file.
func appliedSQLite(ctx context.Context, db *sql.DB) (map[string]int, error) {
	rows, err := db.QueryContext(ctx, `SELECT message_id, count(*) FROM ledger_entries GROUP BY message_id`)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	defer rows.Close()
	applied := map[string]int{}
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

// powerConsumer is one `jetinbox consumer` process, started again when it
// exits, but held down from a power cut until the servers are back.
type powerConsumer struct {
	s    *powerStack
	w    int
	args []string
	env  []string

	exited chan struct{} // closed when supervise returns

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	held    bool // by a cut, until release
	stopped bool
	starts  int
	cuts    int
}

func (s *powerStack) newConsumer(w int) *powerConsumer {
	args := []string{"consumer", "-server", strings.Join(s.natsURLs(), ","), "-database-url", s.dbURL, "-durable", powerDurable,
		"-batch", "100", "-inflight", "2", "-ack-wait", "3s", "-max-deliver", "100", "-http", "", "-log-format", "text", "-drain-timeout", "10s"}
	var env []string
	if s.spec.SQLiteNormal {
		env = append(env, cli.UnsafeSQLiteSynchronousEnv+"=NORMAL")
	}
	return &powerConsumer{s: s, w: w, args: args, env: env, exited: make(chan struct{})}
}

// supervise runs the process until stop, again whenever it exits.
func (c *powerConsumer) supervise(ctx context.Context) {
	defer close(c.exited)
	for ctx.Err() == nil {
		c.mu.Lock()
		if c.stopped {
			c.mu.Unlock()
			return
		}
		if c.held {
			c.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		cmd, err := subproc.Command(context.WithoutCancel(ctx), subproc.RoleJetinbox, c.args...)
		if err != nil {
			c.mu.Unlock()
			c.s.logf("consumer %d: %v", c.w+1, err)
			return
		}
		cmd.Env = append(cmd.Env, c.env...)
		out := &prefixWriter{logf: c.s.logf, prefix: fmt.Sprintf("consumer %d: ", c.w+1)}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			c.mu.Unlock()
			c.s.logf("consumer %d: start: %v", c.w+1, err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		done := make(chan struct{})
		c.cmd, c.done = cmd, done
		c.starts++
		c.mu.Unlock()
		err = cmd.Wait()
		close(done)
		c.mu.Lock()
		c.cmd = nil
		again := !c.held && !c.stopped
		c.mu.Unlock()
		if again {
			c.s.logf("consumer %d: exited (%v); starting it again", c.w+1, err)
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// kill holds the consumer down and SIGKILLs it, returning once it is dead.
func (c *powerConsumer) kill() {
	c.mu.Lock()
	c.held = true
	cmd, done := c.cmd, c.done
	if cmd != nil {
		c.cuts++
	}
	c.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

// end kills the consumer for good and waits until its supervisor is gone.
func (c *powerConsumer) end() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.kill()
	<-c.exited
}

// release lets the consumer start again after a cut.
func (c *powerConsumer) release() {
	c.mu.Lock()
	c.held = false
	c.mu.Unlock()
}

// stop ends the consumer for good: SIGTERM, which drains, then SIGKILL
// if it takes too long.
func (c *powerConsumer) stop() {
	c.mu.Lock()
	c.stopped = true
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

// restarts counts the process's starts that no cut caused.
func (c *powerConsumer) restarts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(c.starts-1-c.cuts, 0)
}

// prefixWriter hands complete lines to logf.
type prefixWriter struct {
	mu     sync.Mutex
	logf   func(format string, a ...any)
	prefix string
	part   []byte
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, b...)
	for {
		i := slices.Index(w.part, '\n')
		if i < 0 {
			return len(b), nil
		}
		w.logf("%s%s", w.prefix, w.part[:i])
		w.part = w.part[i+1:]
	}
}
