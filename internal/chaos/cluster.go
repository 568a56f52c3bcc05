// The jetinbox row on a three-node cluster with R3 streams and consumers,
// every nats-server a process of its own, under the faults a cluster
// meets: leaders killed (SIGKILL) or paused (SIGSTOP past the election
// timeout) while they work, step-downs, a rolling restart, a one-node
// partition and its heal, a client whose server dies with its acks on the
// wire, a consumer process paused past AckWait while another takes its
// messages, and a stream peer replaced by a fresh server during a
// partition.

package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
)

// ClusterFaults are the faults of a cluster run, one phase each, in the
// order they run.
var ClusterFaults = []string{
	"stream-leader-kill",       // the stream leader gets SIGKILL while intents are published
	"consumer-leader-kill",     // the durable's leader gets SIGKILL while batches are consumed
	"stream-leader-pause",      // the stream leader gets SIGSTOP past the election timeout, then SIGCONT
	"consumer-leader-pause",    // the same for the durable's leader
	"step-downs",               // stream, then consumer leader hand over on request
	"rolling-restart",          // every node restarted in turn, each waited for
	"partition",                // the stream leader cut off from the other two, then healed
	"client-server-dies",       // a consumer's server dies as the consumer acks a batch
	"consumer-pause",           // a consumer process gets SIGSTOP past AckWait while another takes its messages, then SIGCONT
	"membership",               // a fresh server joins, a stream peer is removed in its favour, while a node is cut off
	"stream-leader-black-hole", // every byte to and from the stream leader (routes and clients) dropped, nothing closed, then healed
	"one-way-cut",              // a stream follower stops hearing the leader, the leader still hears it, then healed
	"server-remove",            // a fresh server joins, a stream follower is stopped and removed from the cluster ($JS.API.SERVER.REMOVE)
	"membership-partition",     // a fresh server joins; the stream leader is cut off, a follower killed and removed from the cluster meanwhile
}

// ClusterOptions configures a cluster chaos run.
type ClusterOptions struct {
	// Intents published per fault phase.
	Intents int
	// Rate paces the producer (intents per second), so that every fault
	// meets publishes and deliveries in flight. 0: as fast as it goes.
	Rate int
	// Batch, above 1, publishes in atomic batches of this size.
	Batch int
	// Faults to run, from [ClusterFaults], in that order.
	Faults []string
	// Rounds repeats the fault phases (a long run). Default 1.
	Rounds int
	// SyncAlways fsyncs every JetStream write, the production setting.
	SyncAlways bool
	// Unsafe publishes, beside every fourth intent, a twin under its own
	// ID the way a producer that does not wait for PubAcks does: a core
	// NATS publish to the stream's subject, never retried. Each phase
	// then gets a row of its own for the twins, which shows what the
	// shipped publisher's wait and retries keep from being lost.
	Unsafe bool
	// AckWait is the durable's redelivery timer; consumer-pause holds a
	// consumer process longer. Default 3s.
	AckWait time.Duration
	// Progress, if set, gets a line per step.
	Progress io.Writer
	// Logger, if set, gets the consumers' logs (nil: discarded).
	Logger *slog.Logger
	// OnStall, if set, is called when a phase or the settling timed out,
	// while the consumers still run (a test dumps their goroutines).
	OnStall func()
}

// ClusterRow counts the intents published during one fault phase, as
// Jepsen counts a run: lost (acknowledged to the producer, never applied
// nor dead-lettered), applied once, duplicated (applied more than once),
// unexpected (an effect of an ID nobody published). Unacknowledged counts
// intents whose publish the producer gave up on: they may or may not be
// applied, and are not lost.
type ClusterRow struct {
	Fault string
	// Unsafe marks a row of the unsafe twins (see [ClusterOptions.Unsafe]):
	// its loss is expected and shows that the run can see loss.
	Unsafe         bool
	Intents        int
	Unacknowledged int
	Lost           int
	AppliedOnce    int
	Duplicated     int
	Unexpected     int
	DeadLettered   int
	Elapsed        time.Duration
	Note           string
}

// ClusterMain is `jetinbox chaos -cluster`: its own flags, after -cluster.
func ClusterMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox chaos -cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := ClusterOptions{Progress: stderr}
	var faults string
	fs.IntVar(&o.Intents, "intents", 2000, "intents published per fault phase")
	fs.IntVar(&o.Rate, "rate", 500, "intents per second the producer publishes (0: unpaced)")
	fs.IntVar(&o.Batch, "batch", 0, "publish in atomic batches of this size (0: one by one)")
	fs.IntVar(&o.Rounds, "rounds", 1, "run every fault phase this many times")
	fs.BoolVar(&o.SyncAlways, "sync-always", true, "the nodes fsync every JetStream write (sync_interval: always)")
	fs.BoolVar(&o.Unsafe, "unsafe", true, "beside every fourth intent, publish a twin as a producer that does not wait for PubAcks (core publish, no retry), counted in rows of its own")
	fs.DurationVar(&o.AckWait, "ack-wait", 3*time.Second, "the durable's AckWait; consumer-pause pauses a consumer process for longer")
	fs.StringVar(&faults, "faults", strings.Join(ClusterFaults, ","), "fault phases, in order: "+strings.Join(ClusterFaults, ", "))
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox chaos -cluster: the jetinbox row (stable IDs, inbox consumer) on three\n"+
			"nats-servers, each a process of its own (this binary re-executed), with R3 streams and consumers,\n"+
			"one phase per fault: SIGKILL and SIGSTOP of the leaders, step-downs, a rolling restart, a\n"+
			"partition, a consumer's server dying, a `jetinbox consumer` process paused past AckWait, a\n"+
			"stream peer replaced by a fresh server during a partition, a black-holed stream leader, a\n"+
			"one-way cut, a server removed from the cluster, and a removal during a partition. Counts lost, applied once,\n"+
			"duplicated and unexpected per phase, then runs verify on the end state. Beside each phase, an\n"+
			"unsafe row counts twins published without waiting for a PubAck: their loss shows the run can see loss.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError{Err: fmt.Errorf("chaos -cluster: unexpected arguments %q", fs.Args())}
	}
	o.Faults = strings.Split(faults, ",")
	for _, f := range o.Faults {
		if !slices.Contains(ClusterFaults, f) {
			return cli.UsageError{Err: fmt.Errorf("chaos -cluster: unknown fault %q (known: %s)", f, strings.Join(ClusterFaults, ", "))}
		}
	}
	if o.Intents < 1 || o.Rate < 0 || o.Batch < 0 || o.Batch > jsinbox.MaxBatch || o.Rounds < 1 || o.AckWait < time.Second {
		return cli.UsageError{Err: fmt.Errorf("chaos -cluster: -intents and -rounds must be at least 1, -rate at least 0, -batch 0..%d, -ack-wait at least 1s", jsinbox.MaxBatch)}
	}
	rows, rep, stats, err := RunCluster(ctx, o)
	if err != nil {
		return err
	}
	WriteClusterTable(stdout, rows)
	fmt.Fprintf(stdout, "\npublish retries %d (same IDs), duplicates dropped by the stream %d; deliveries %d, redeliveries %d, found applied by the inbox %d; consumer restarts %d\n",
		stats.Publisher.Retries, stats.Publisher.Duplicates, stats.Consumers.Received, stats.Consumers.Redeliveries, stats.Consumers.Duplicates, stats.Restarts)
	fmt.Fprintln(stdout, "\nverify on the end state:")
	rep.WriteTable(stdout)
	for _, r := range rows {
		if !r.Unsafe && (r.Lost > 0 || r.Duplicated > 0 || r.Unexpected > 0) {
			return fmt.Errorf("chaos -cluster: %s: lost %d, duplicated %d, unexpected %d", r.Fault, r.Lost, r.Duplicated, r.Unexpected)
		}
	}
	if !rep.Clean() {
		return errors.New("chaos -cluster: verify found violations")
	}
	return nil
}

// WriteClusterTable prints the rows and their total, the unsafe rows'
// total apart; when unsafe rows lost nothing it says that this run could
// not show loss.
func WriteClusterTable(w io.Writer, rows []ClusterRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "fault\tintents\tunacknowledged\tlost\tapplied once\tduplicated\tunexpected\tdead-lettered\ttime\twhat happened")
	line := func(r ClusterRow) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.1fs\t%s\n", r.Fault, r.Intents, r.Unacknowledged, r.Lost, r.AppliedOnce, r.Duplicated, r.Unexpected, r.DeadLettered, r.Elapsed.Seconds(), r.Note)
	}
	t := ClusterRow{Fault: "total"}
	u := ClusterRow{Fault: "total, unsafe", Unsafe: true}
	for _, r := range rows {
		line(r)
		s := &t
		if r.Unsafe {
			s = &u
		}
		s.Intents += r.Intents
		s.Unacknowledged += r.Unacknowledged
		s.Lost += r.Lost
		s.AppliedOnce += r.AppliedOnce
		s.Duplicated += r.Duplicated
		s.Unexpected += r.Unexpected
		s.DeadLettered += r.DeadLettered
		s.Elapsed += r.Elapsed
	}
	line(t)
	if u.Intents > 0 {
		if u.Lost+u.Duplicated == 0 {
			u.Note = "the unsafe twins lost nothing: this run could not show loss"
		} else {
			u.Note = "what a producer that does not wait for PubAcks loses under the same faults"
		}
		line(u)
	}
	tw.Flush()
}

// unsafeTwins are the twins of [ClusterOptions.Unsafe]: every fourth
// intent again, under its own ID.
func unsafeTwins(intents []inbox.Intent) []inbox.Intent {
	var tw []inbox.Intent
	for i := 0; i < len(intents); i += 4 {
		in := intents[i]
		in.ID = "unsafe-" + in.ID
		tw = append(tw, in)
	}
	return tw
}

// dieArm is the client-server-dies fault, armed: ch closes once a
// consumer's server was stopped, and consumer says which one.
type dieArm struct {
	ch       chan struct{}
	consumer int
}

// clusterRun is the state of one cluster run.
type clusterRun struct {
	o       ClusterOptions
	cl      *natsenv.NATSProcs
	pool    *pgxpool.Pool
	dbURL   string
	nc      *nats.Conn // the producer's and the operator's connection
	js      jetstream.JetStream
	pub     *jsinbox.Publisher
	start   time.Time
	stream  string
	durable string

	// armDie, when set, makes the next consumer to ack a batch stop the
	// node it is connected to, and close the channel.
	armDie  atomic.Pointer[dieArm]
	crashes atomic.Int64

	statsMu sync.Mutex
	stats   jsinbox.ConsumerStats // of the consumers' ended lives

	// The in-process workers step aside while consumer processes run
	// (holdWorkers).
	workMu   sync.Mutex
	workCond *sync.Cond
	held     bool
	working  int
	cancels  map[int]context.CancelFunc

	// consumer-pause's first consumer process, started before the phase
	// publishes; the durable's unacked count then, and the durable.
	pauseA    *consumerProc
	pauseBase int
	pauseCons jetstream.Consumer
	// membership's fresh server, joined before the phase publishes.
	fresh int
	// joined are the fresh servers that joined before this phase.
	joined []int
	// removed are the servers removed from the cluster: down for good.
	removed map[int]bool
	// unsafeFailed holds the IDs of unsafe twins whose publish the
	// client refused (string to bool).
	unsafeFailed sync.Map
}

// ClusterStats says how hard the faults hit: publish retries and the
// duplicates the stream dropped, redeliveries, and deliveries the inbox
// found already applied.
type ClusterStats struct {
	Publisher jsinbox.PublisherStats
	Consumers jsinbox.ConsumerStats
	Restarts  int64
}

func (r *clusterRun) say(format string, a ...any) {
	if r.o.Progress != nil {
		fmt.Fprintf(r.o.Progress, "%6.1fs  %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, a...))
	}
}

// RunCluster starts PostgreSQL and a three-node cluster of nats-server
// processes, runs every fault phase with the producer publishing and two
// inbox consumers consuming (in this process; consumer-pause runs its
// consumers as `jetinbox consumer` processes), waits until everything is
// settled and returns a row per phase and verify's report on the end
// state. The binary must run the nats-server and jetinbox child roles
// (subproc.Dispatch; a test binary registers [ConsumerRole] as jetinbox).
func RunCluster(ctx context.Context, o ClusterOptions) ([]ClusterRow, *verify.Report, *ClusterStats, error) {
	if o.Rounds < 1 {
		o.Rounds = 1
	}
	if o.AckWait <= 0 {
		o.AckWait = 3 * time.Second
	}
	r := &clusterRun{o: o, start: time.Now(), stream: jsinbox.DefaultStream, durable: "ledger", cancels: map[int]context.CancelFunc{}, removed: map[int]bool{}}
	r.workCond = sync.NewCond(&r.workMu)
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		return nil, nil, nil, err
	}
	defer pg.Close()
	syncInterval := ""
	if o.SyncAlways {
		syncInterval = "always"
	}
	if r.cl, err = natsenv.StartNATSProcs(ctx, natsenv.NATSProcsOptions{Nodes: 3, SyncInterval: syncInterval,
		// Clients through proxies, so that a black hole reaches them; the
		// system account for removing a server. Only when a phase needs
		// them: the other phases run as they always have.
		ClientProxies: slices.Contains(o.Faults, "stream-leader-black-hole"),
		SystemAccount: slices.Contains(o.Faults, "server-remove") || slices.Contains(o.Faults, "membership-partition")}); err != nil {
		return nil, nil, nil, err
	}
	defer r.cl.Close()
	r.say("three nats-server processes up (%s), meta leader elected", r.cl.URLs())
	if r.dbURL, err = pg.CreateDatabase(ctx, "chaos_cluster"); err != nil {
		return nil, nil, nil, err
	}
	if r.pool, err = pginbox.NewPool(ctx, r.dbURL); err != nil {
		return nil, nil, nil, fmt.Errorf("chaos: %w", err)
	}
	defer r.pool.Close()
	if r.nc, err = connectAll(r.cl.URLs(), "chaos-producer"); err != nil {
		return nil, nil, nil, err
	}
	defer r.nc.Close()
	r.js, _ = jetstream.New(r.nc)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = setupR3(sctx, r.js, r.pool)
	cancel()
	if err != nil {
		return nil, nil, nil, err
	}
	r.pub, err = jsinbox.NewPublisher(r.js, jsinbox.PublisherConfig{Batch: o.Batch, AckTimeout: 2 * time.Second, MaxInFlight: 256,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 50 * time.Millisecond, Cap: 2 * time.Second, MaxElapsed: 90 * time.Second}})
	if err != nil {
		return nil, nil, nil, err
	}
	defer r.pub.Close()

	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() { r.supervise(wctx, w) })
	}
	defer func() { stopWorkers(); wg.Wait() }()
	// The faults are meant to meet a working pipeline: wait for the
	// durable the workers create.
	if _, err := r.cl.WaitConsumerLeader(ctx, r.stream, r.durable); err != nil {
		return nil, nil, nil, err
	}
	if err := r.cl.WaitHealthy(ctx); err != nil {
		return nil, nil, nil, err
	}

	type phase struct {
		fault   string
		intents []inbox.Intent
		twins   []inbox.Intent
		row     ClusterRow
	}
	var phases []*phase
	for round := range o.Rounds {
		for _, f := range o.Faults {
			p := &phase{fault: f}
			p.intents = pipeline.Generate(pipeline.Load{Count: o.Intents, Accounts: 64, Prefix: fmt.Sprintf("%s-%d", f, round), Seed: uint64(len(phases) + 1)})
			t0 := time.Now()
			note, err := r.phase(ctx, f, p.intents)
			if err != nil {
				r.sayState()
				return nil, nil, nil, fmt.Errorf("chaos -cluster: %s: %w", f, err)
			}
			p.row = ClusterRow{Fault: f, Intents: len(p.intents), Elapsed: time.Since(t0), Note: note}
			if o.Unsafe {
				p.twins = unsafeTwins(p.intents)
			}
			phases = append(phases, p)
		}
	}
	if err := r.pub.Flush(ctx); err != nil {
		return nil, nil, nil, err
	}
	r.say("everything published; waiting for the consumers to settle the stream")
	wctxS, cancel := context.WithTimeout(ctx, 3*time.Minute)
	err = pipeline.WaitSettled(wctxS, r.js, r.stream, r.durable, nil)
	cancel()
	if err != nil {
		r.sayState()
	}
	stopWorkers()
	wg.Wait()
	if err != nil {
		return nil, nil, nil, err
	}
	failed := map[string]bool{}
	for _, f := range r.pub.Failures() {
		failed[f.ID] = true
	}
	published := map[string]bool{}
	for _, p := range phases {
		for _, in := range p.intents {
			published[in.ID] = true
		}
		for _, in := range p.twins {
			published[in.ID] = true
		}
	}
	r.unsafeFailed.Range(func(id, _ any) bool {
		failed[id.(string)] = true
		return true
	})
	var applied map[string]int
	var dead map[string]bool
	var unexpected int
	err = r.afterFaults(ctx, "the dead-letter stream", func() (err error) {
		applied, dead, unexpected, err = r.tally(ctx, published)
		return err
	})
	if err != nil {
		return nil, nil, nil, err
	}
	count := func(row *ClusterRow, intents []inbox.Intent) {
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
	}
	var rows []ClusterRow
	last := -1 // the last shipped row
	for _, p := range phases {
		row := p.row
		count(&row, p.intents)
		rows = append(rows, row)
		last = len(rows) - 1
		if len(p.twins) > 0 {
			u := ClusterRow{Fault: p.fault + " (unsafe)", Unsafe: true, Intents: len(p.twins), Elapsed: row.Elapsed, Note: "twins published without waiting for a PubAck"}
			count(&u, p.twins)
			rows = append(rows, u)
		}
	}
	// An unexpected entry belongs to no phase: the last shipped row
	// carries them.
	if last >= 0 {
		rows[last].Unexpected = unexpected
	}
	var rep *verify.Report
	err = r.afterFaults(ctx, "the stream", func() (err error) {
		rep, err = verify.Run(ctx, r.js, r.pool, verify.Options{Scope: effects.DefaultScope, Durable: r.durable, Ledger: true})
		return err
	})
	if err != nil {
		return nil, nil, nil, err
	}
	stats := &ClusterStats{Publisher: r.pub.Stats(), Consumers: r.stats, Restarts: r.crashes.Load()}
	r.say("verified; %d publish retries, %d duplicates dropped by the stream; %d redeliveries, %d found applied by the inbox; %d consumer restarts",
		stats.Publisher.Retries, stats.Publisher.Duplicates, stats.Consumers.Redeliveries, stats.Consumers.Duplicates, stats.Restarts)
	return rows, rep, stats, nil
}

// connectAll connects to every node's URL: when its node goes away the
// client reconnects to another one.
func connectAll(urls, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(urls, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 50*time.Millisecond),
		// A write to a server that just died is what this harness is
		// for: keep nats.go's default handler from printing it.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		return nil, fmt.Errorf("chaos: connect %s: %w", name, err)
	}
	return nc, nil
}

// setupR3 migrates and creates the R3 streams, retrying while the meta
// group places the first stream.
func setupR3(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool) error {
	var last error
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = pipeline.Setup(actx, js, pool, jsinbox.StreamConfig{Replicas: 3}, 64)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: R3 setup: %w (last error: %w)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// phase publishes intents and, once a third of them is out, applies the
// fault; it returns when both are done and the cluster is whole again.
func (r *clusterRun) phase(ctx context.Context, fault string, intents []inbox.Intent) (string, error) {
	if fault == "consumer-pause" {
		cleanup, err := r.prepareConsumerPause(ctx)
		if err != nil {
			return "", err
		}
		defer cleanup()
	}
	if fault == "membership" || fault == "server-remove" || fault == "membership-partition" {
		// The fresh server joins first: the peer change and the
		// partition then meet the publishing.
		n, err := r.cl.AddNode(ctx)
		if err != nil {
			return "", err
		}
		r.fresh = n
		r.say("  %s joined the cluster (pid %d)", r.cl.Name(n), r.cl.Pid(n))
		// The removal during a partition needs a meta quorum without the
		// node cut off and the node killed: five servers.
		r.joined = []int{n}
		for fault == "membership-partition" && len(r.answeringExcept(-1)) < 5 {
			if n, err = r.cl.AddNode(ctx); err != nil {
				return "", err
			}
			r.joined = append(r.joined, n)
			r.say("  %s joined the cluster (pid %d)", r.cl.Name(n), r.cl.Pid(n))
		}
	}
	r.say("phase %s: publishing %d intents", fault, len(intents))
	third := make(chan struct{})
	pubErr := make(chan error, 1)
	go func() {
		var tick *time.Ticker
		if r.o.Rate > 0 {
			tick = time.NewTicker(time.Second / time.Duration(r.o.Rate))
			defer tick.Stop()
		}
		for i, in := range intents {
			if i == len(intents)/3 {
				close(third)
			}
			if tick != nil {
				<-tick.C
			}
			if err := r.pub.PublishAsync(ctx, in); err != nil {
				pubErr <- err
				return
			}
			if r.o.Unsafe && i%4 == 0 {
				r.publishUnsafe(in)
			}
		}
		if len(intents) < 3 {
			close(third)
		}
		pubErr <- nil
	}()
	select {
	case <-third:
	case err := <-pubErr:
		return "", err
	}
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	note, err := r.fault(fctx, fault)
	if err != nil {
		return "", err
	}
	if err := <-pubErr; err != nil {
		return "", err
	}
	// The next phase starts on a whole cluster, as an operator would wait.
	if err := r.whole(fctx); err != nil {
		return "", err
	}
	return note, nil
}

// publishUnsafe publishes in's unsafe twin (see [unsafeTwins]) as a
// producer that does not wait for a PubAck: one core publish, never
// retried. An error the client reports is remembered (unacknowledged);
// a message the stream never stored is not, and shows as lost.
func (r *clusterRun) publishUnsafe(in inbox.Intent) {
	id := "unsafe-" + in.ID
	m := &nats.Msg{Subject: in.Subject, Data: in.Payload, Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}
	if err := r.nc.PublishMsg(m); err != nil {
		r.unsafeFailed.Store(id, true)
	}
}

// whole waits until every node runs and the stream and durable have a
// leader with every replica current.
func (r *clusterRun) whole(ctx context.Context) error {
	if err := r.cl.WaitHealthy(ctx); err != nil {
		return err
	}
	if err := r.cl.WaitStreamCurrent(ctx, r.stream); err != nil {
		return err
	}
	_, err := r.cl.WaitConsumerLeader(ctx, r.stream, r.durable)
	return err
}

// fault applies one fault and says what happened.
func (r *clusterRun) fault(ctx context.Context, fault string) (string, error) {
	switch fault {
	case "stream-leader-kill":
		l, err := r.cl.WaitStreamLeader(ctx, r.stream)
		if err != nil {
			return "", err
		}
		return r.killAndRestart(ctx, l, "stream leader")
	case "consumer-leader-kill":
		l, err := r.cl.WaitConsumerLeader(ctx, r.stream, r.durable)
		if err != nil {
			return "", err
		}
		return r.killAndRestart(ctx, l, "consumer leader")
	case "step-downs":
		sl, nsl, err := r.cl.MoveStreamLeader(ctx, r.nc, r.stream)
		if err != nil {
			return "", err
		}
		cl, ncl, err := r.cl.MoveConsumerLeader(ctx, r.nc, r.stream, r.durable)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("stream leader %s → %s, consumer leader %s → %s", r.cl.Name(sl), r.cl.Name(nsl), r.cl.Name(cl), r.cl.Name(ncl)), nil
	case "rolling-restart":
		var names []string
		for i := range r.cl.Size() {
			if r.removed[i] {
				continue
			}
			if err := r.cl.Restart(i); err != nil {
				return "", err
			}
			if err := r.whole(ctx); err != nil {
				return "", err
			}
			r.say("  restarted %s; stream and durable whole again", r.cl.Name(i))
			names = append(names, r.cl.Name(i))
		}
		return strings.Join(names, ", ") + " restarted in turn", nil
	case "partition":
		l, err := r.cl.WaitStreamLeader(ctx, r.stream)
		if err != nil {
			return "", err
		}
		r.cl.Partition(l)
		r.say("  partitioned %s (stream leader) from the other two", r.cl.Name(l))
		// StreamLeader asks the nodes that are not cut off first.
		nl, err := r.waitNewLeader(ctx, l, func() int { return r.cl.StreamLeader(r.stream) })
		if err != nil {
			return "", err
		}
		time.Sleep(2 * time.Second) // the minority stays cut off a while
		if err := r.cl.Heal(l); err != nil {
			return "", err
		}
		r.say("  healed %s", r.cl.Name(l))
		return fmt.Sprintf("%s cut off (the majority elected %s), healed", r.cl.Name(l), r.cl.Name(nl)), nil
	case "client-server-dies":
		fired := &dieArm{ch: make(chan struct{})}
		r.armDie.Store(fired)
		select {
		case <-fired.ch:
		case <-ctx.Done():
			r.armDie.Store(nil)
			return "", fmt.Errorf("no consumer acked a batch: %w", ctx.Err())
		}
		var dead int
		for i := range r.cl.Size() {
			if !r.cl.Running(i) && !r.removed[i] {
				dead = i
			}
		}
		if err := r.cl.WaitMetaLeader(ctx); err != nil {
			return "", err
		}
		time.Sleep(time.Second)
		if err := r.cl.Start(dead); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s killed as consumer %d acked a batch; the consumer reconnected to another node; %s restarted", r.cl.Name(dead), fired.consumer, r.cl.Name(dead)), nil
	case "stream-leader-pause":
		l, err := r.cl.WaitStreamLeader(ctx, r.stream)
		if err != nil {
			return "", err
		}
		return r.pauseLeader(ctx, l, "stream leader", func() int { return r.cl.StreamLeader(r.stream) })
	case "consumer-leader-pause":
		l, err := r.cl.WaitConsumerLeader(ctx, r.stream, r.durable)
		if err != nil {
			return "", err
		}
		return r.pauseLeader(ctx, l, "consumer leader", func() int { return r.cl.ConsumerLeader(r.stream, r.durable) })
	case "consumer-pause":
		return r.consumerPause(ctx)
	case "membership":
		return r.membership(ctx)
	case "stream-leader-black-hole":
		return r.blackHoleLeader(ctx)
	case "one-way-cut":
		return r.oneWayCut(ctx)
	case "server-remove":
		return r.serverRemove(ctx)
	case "membership-partition":
		return r.membershipPartition(ctx)
	}
	return "", fmt.Errorf("unknown fault %q", fault)
}

// afterFaults runs read once every node is healthy again, up to three
// times (natsenv.Cluster.ReadWhenHealthy).
func (r *clusterRun) afterFaults(ctx context.Context, what string, read func() error) error {
	return r.cl.ReadWhenHealthy(ctx, read, func(err error) { r.say("could not read %s (%v); again", what, err) })
}

// killAndRestart kills node i (no leadership handed over), waits for the
// groups to elect elsewhere, and starts it again.
func (r *clusterRun) killAndRestart(ctx context.Context, i int, role string) (string, error) {
	if err := r.cl.Kill(i); err != nil {
		return "", err
	}
	r.say("  killed %s (%s)", r.cl.Name(i), role)
	sl, err := r.cl.WaitStreamLeader(ctx, r.stream)
	if err != nil {
		return "", err
	}
	cl, err := r.cl.WaitConsumerLeader(ctx, r.stream, r.durable)
	if err != nil {
		return "", err
	}
	time.Sleep(time.Second) // work goes on with two nodes for a while
	if err := r.cl.Start(i); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s (%s) killed; stream leader %s, consumer leader %s; restarted", r.cl.Name(i), role, r.cl.Name(sl), r.cl.Name(cl)), nil
}

func (r *clusterRun) waitNewLeader(ctx context.Context, old int, leader func() int) (int, error) {
	for {
		if l := leader(); l >= 0 && l != old {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("no new leader after %s: %w", r.cl.Name(old), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// logger is consumer w's logger.
func (r *clusterRun) logger(w int) *slog.Logger {
	if r.o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.o.Logger.With("consumer", w+1)
}

// sayState reports, when a phase or the settling timed out, what the
// cluster and the durable look like: who leads, what is pending, what
// each consumer did. It is what a stall needs to be understood later.
func (r *clusterRun) sayState() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range r.cl.Size() {
		state := fmt.Sprintf("pid %d", r.cl.Pid(i))
		if !r.cl.Running(i) {
			state = "down"
		}
		r.say("state: %s %s; last log lines:\n%s", r.cl.Name(i), state, r.cl.Log(i))
	}
	r.say("state: stream leader %d, consumer leader %d (node index, -1 none)", r.cl.StreamLeader(r.stream), r.cl.ConsumerLeader(r.stream, r.durable))
	if c, err := r.js.Consumer(ctx, r.stream, r.durable); err != nil {
		r.say("state: consumer info: %v", err)
	} else {
		ci := c.CachedInfo()
		r.say("state: durable pending %d, ack pending %d, waiting pulls %d, redelivered %d, delivered stream seq %d, ack floor %d, cluster %+v",
			ci.NumPending, ci.NumAckPending, ci.NumWaiting, ci.NumRedelivered, ci.Delivered.Stream, ci.AckFloor.Stream, ci.Cluster)
	}
	r.statsMu.Lock()
	r.say("state: ended consumer lives: %+v; restarts %d", r.stats, r.crashes.Load())
	r.statsMu.Unlock()
	r.say("state: publisher %+v", r.pub.Stats())
	if r.o.OnStall != nil {
		r.o.OnStall()
	}
}

// supervise runs inbox consumer w, on its own connection to all three
// nodes, and starts it again when it stops.
func (r *clusterRun) supervise(ctx context.Context, w int) {
	for ctx.Err() == nil {
		lctx, ok := r.workerLife(ctx, w)
		if !ok {
			return
		}
		err := r.runWorker(lctx, w)
		r.workerDone(w)
		if err != nil && lctx.Err() == nil {
			r.crashes.Add(1)
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func (r *clusterRun) runWorker(ctx context.Context, w int) error {
	nc, err := connectAll(r.cl.URLs(), fmt.Sprintf("chaos-consumer-%d", w+1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	proc, err := inbox.NewProcessor(pginbox.New(r.pool), effects.NewLedger(), inbox.Config{Scope: effects.DefaultScope, Logger: r.logger(w)})
	if err != nil {
		return err
	}
	c, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{Durable: r.durable, BatchSize: consumerBatch, AckWait: r.o.AckWait,
		MaxDeliver: consumerMaxDeliver, MaxAckPending: consumerMaxAckPending})
	if err != nil {
		return err
	}
	// The client whose server dies mid-batch: when armed, the node the
	// first consumer to ack a batch is connected to is stopped as its
	// acks go out. Either consumer: the one that happens to get no batch
	// while the fault is armed (the other took them all) must not make
	// the phase wait for a batch that never comes.
	hook.Attach(c, func(p hook.Point) bool {
		if p != hook.SkipAck {
			return false
		}
		fired := r.armDie.Swap(nil)
		if fired == nil {
			return false
		}
		if n := r.cl.Node(nc.ConnectedServerName()); n >= 0 {
			go func() {
				_ = r.cl.Kill(n)
				r.say("  killed %s, consumer %d's server, as it acked a batch", r.cl.Name(n), w+1)
				fired.consumer = w + 1
				close(fired.ch)
			}()
		} else {
			r.armDie.Store(fired) // not connected now: next batch
		}
		return false
	})
	err = c.Run(ctx)
	st := c.Stats()
	r.statsMu.Lock()
	r.stats.Received += st.Received
	r.stats.Applied += st.Applied
	r.stats.Duplicates += st.Duplicates
	r.stats.Redeliveries += st.Redeliveries
	r.stats.DeadLettered += st.DeadLettered
	r.stats.Batches += st.Batches
	r.stats.FailedBatches += st.FailedBatches
	r.stats.Rescued += st.Rescued
	r.statsMu.Unlock()
	return err
}

// tally reads the ledger entries per message ID and the dead letters. An
// entry whose ID was never published is unexpected.
func (r *clusterRun) tally(ctx context.Context, published map[string]bool) (applied map[string]int, dead map[string]bool, unexpected int, err error) {
	applied, dead = map[string]int{}, map[string]bool{}
	rows, err := r.pool.Query(ctx, `SELECT message_id, count(*) FROM ledger_entries GROUP BY message_id`)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("chaos: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, nil, 0, fmt.Errorf("chaos: %w", err)
		}
		applied[id] = n
		if !published[id] {
			unexpected++
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, 0, fmt.Errorf("chaos: %w", err)
	}
	dls, err := verify.ReadStream(ctx, r.js, jsinbox.DeadLetterStream(r.stream))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil, 0, err
	}
	for _, d := range dls {
		dead[d.Header[jsinbox.HeaderMessageID]] = true
	}
	return applied, dead, unexpected, nil
}
