package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
)

// errDemoFailed makes the demo exit 1.
var errDemoFailed = errors.New("demo: intents were lost or applied twice")

// Demo runs the whole pipeline with faults switched on and verifies it.
func Demo(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox demo", "Run producer → JetStream → two inbox consumers → the inbox store with faults on, then verify.\n"+
		"Embedded nats-server unless NATS_URL is set. The inbox: DATABASE_URL if set, else a throwaway PostgreSQL\n"+
		"if its server binaries are installed, else a SQLite file in a temporary directory; -store picks.", stderr)
	var (
		n           = fs.Int("intents", 20000, "distinct intents to publish")
		accounts    = fs.Int("accounts", 100, "ledger accounts")
		consumers   = fs.Int("consumers", 2, "consumer processes on the one durable")
		dupFrac     = fs.Float64("replay-fraction", 0.02, "fraction of intents an upstream system publishes again after the duplicate window")
		timeout     = fs.Duration("timeout", 3*time.Minute, "give up waiting for the pipeline to settle after this long")
		verbose     = fs.Bool("v", false, "log what the consumers do (dead letters, crashes, retries)")
		syncAlways  = fs.Bool("sync-always", true, "embedded server fsyncs every JetStream write, as production must (sync_interval: always)")
		cluster     = fs.Bool("cluster", false, "run on three embedded nats-servers with R3 streams and consumers, and kill the stream leader halfway through publishing")
		httpHop     = fs.Bool("http", demoHTTPDefault(), "then run the first hop over HTTP: clients POST intents with an Idempotency-Key through a lossy proxy to jetinbox intake processes (needs the PostgreSQL server binaries; on by default where they are)")
		scope       = cli.ScopeFlag(fs, env)
		durable     = cli.DurableFlag(fs, env)
		withConsole = fs.Bool("console", false, "after the verified result, keep the operator console up on the run's servers and print its URL and the pages of telling IDs (Ctrl-C ends it)")
		consoleAddr = fs.String("console-listen", "127.0.0.1:0", "-console: address to serve it on (loopback by default)")
		shots       = fs.String("screenshots", "", "-console: take a PNG of each console page into this directory with headless Chromium, then exit")
		storeFlag   = fs.String("store", "", "where the inbox lives: sqlite (a file in a temporary directory), postgres (a throwaway server), or a database URL "+
			"(postgres://… or sqlite:///path); default: DATABASE_URL, else postgres if its server binaries are installed, else sqlite")
	)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *n < 10 || *consumers < 1 {
		return cli.UsageError{Err: errors.New("-intents must be at least 10 and -consumers at least 1")}
	}
	if err := cli.CheckScope(*scope); err != nil {
		return err
	}
	if *cluster && env("NATS_URL") != "" {
		return cli.UsageError{Err: errors.New("-cluster starts its own three nodes: unset NATS_URL")}
	}
	start := time.Now()
	level := slog.LevelError + 1
	if *verbose {
		level = slog.LevelInfo
	}
	log := cli.EnvLogger(stderr, env, level)
	var sayMu sync.Mutex // consumers restarted after a crash say so from their own goroutines
	say := func(format string, a ...any) {
		sayMu.Lock()
		defer sayMu.Unlock()
		fmt.Fprintf(stderr, "%6.1fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
	userCtx := ctx
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	// The store first: the first lines say which one the demo runs on.
	store, closeStore, err := demoStore(ctx, *storeFlag, env, say)
	if err != nil {
		return err
	}
	defer closeStore()

	run := strconv.FormatUint(rand.Uint64()>>28, 36)
	streamOpts := jsinbox.StreamConfig{DuplicateWindow: 3 * time.Second}
	subject := "intents"

	// NATS: embedded unless NATS_URL is set.
	natsURL := env("NATS_URL")
	var nodes *natsenv.Cluster
	if *cluster {
		var err error
		if nodes, err = natsenv.StartCluster(ctx, natsenv.ClusterOptions{SyncAlways: *syncAlways}); err != nil {
			return err
		}
		defer nodes.Close()
		natsURL = nodes.URLs()
		streamOpts.Replicas = 3
		say("three embedded nats-servers %s (JetStream cluster, R3 streams and consumers, sync_interval: always)", natsURL)
	} else if natsURL == "" {
		srv, err := natsenv.StartNATS(natsenv.NATSOptions{SyncAlways: *syncAlways})
		if err != nil {
			return err
		}
		defer srv.Close()
		natsURL = srv.URL()
		say("embedded nats-server %s (JetStream, file store, sync_interval: always)", natsURL)
	} else {
		// A stream of our own on a shared server.
		streamOpts.Name, subject = "DEMO_"+run, "demo"+run
		streamOpts.Subjects = []string{subject + ".>"}
		say("NATS at %s, stream %s", cli.Redact(natsURL), streamOpts.Name)
	}
	streamOpts = streamOpts.WithDefaults()

	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := demoSetup(ctx, js, store, streamOpts, *accounts, nodes != nil); err != nil {
		return err
	}
	say("migrated; %d accounts; stream %s (DiscardNew, deny delete/purge, duplicate window %v)", *accounts, streamOpts.Name, streamOpts.DuplicateWindow)

	// Consumers, each on its own connection as separate processes would be.
	// Consumer 1 crashes once between COMMIT and ACK and drops some acks.
	// On shared servers the stream and the schema are the run's own, so the
	// scope and the durable cannot meet anyone else's.
	cfg := jsinbox.ConsumerConfig{Stream: streamOpts.Name, Durable: *durable, BatchSize: 200, InFlight: 3,
		AckWait: 2 * time.Second, MaxDeliver: 20}
	fleet := &demoFleet{natsURL: natsURL, store: store, scope: *scope, cfg: cfg, log: log, say: say}
	crashFP := failpoint.New()
	crashFP.EnableEvery(failpoint.AfterCommit, 5, 1)
	crashFP.EnableEvery(failpoint.SkipAck, 4, 4)
	for i := range *consumers {
		fp := failpoint.New()
		if i == 0 {
			fp = crashFP
		}
		if err := fleet.start(ctx, i+1, fp); err != nil {
			return err
		}
	}
	say("%d consumers on durable %q, inbox scope %q (batch ≤ %d, %d in flight, AckWait %v); consumer 1 will crash after a COMMIT and drop acks",
		*consumers, *durable, *scope, cfg.BatchSize, cfg.InFlight, cfg.AckWait)
	if nodes != nil {
		if err := waitDurable(ctx, nodes, streamOpts.Name, *durable); err != nil {
			return err
		}
	}

	// Producer, losing some PubAcks so that it retries with the same ID.
	intents := pipeline.Generate(pipeline.Load{Count: *n, Accounts: *accounts, Prefix: "demo-" + run, Subject: subject, Seed: rand.Uint64()})
	pubFP := failpoint.New()
	pubFP.EnableEvery(failpoint.LosePubAck, 40, -1)
	retry := jitter.Policy{Kind: jitter.Full, Base: 20 * time.Millisecond, Cap: 250 * time.Millisecond, MaxAttempts: 8}
	if nodes != nil {
		retry = clusterRetry // the budget must outlast a leader election
	}
	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{
		Stream: streamOpts.Name, MaxInFlight: 1024, AckTimeout: time.Second, Retry: retry,
	})
	if err != nil {
		return err
	}
	defer pub.Close()
	pubFP.Attach(pub)
	poison := poisonIntents(subject, run)
	var leaderKill <-chan error
	for i, in := range append(intents, poison...) {
		if nodes != nil && i == len(intents)/2 {
			leaderKill = killStreamLeader(ctx, nodes, streamOpts.Name, say)
		}
		if err := pub.PublishAsync(ctx, in); err != nil {
			return err
		}
	}
	if leaderKill != nil {
		if err := <-leaderKill; err != nil {
			return err
		}
	}
	// A message without an ID: a broken producer. Published raw.
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject + ".noid", Data: []byte(`{"account":1,"amount":5}`)}); err != nil {
		return err
	}
	if err := pub.Flush(ctx); err != nil {
		return err
	}
	say("published %d intents + %d poison + 1 without ID; %d PubAcks lost on purpose", len(intents), len(poison), pubFP.Hits(failpoint.LosePubAck))

	// After the duplicate window, an upstream system replays some intents
	// and reuses one ID with a different payload: the stream keeps these
	// copies, only the inbox can catch them.
	select {
	case <-time.After(streamOpts.DuplicateWindow + 500*time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	replays := intents[:int(float64(len(intents))**dupFrac)]
	for _, in := range replays {
		if err := pub.PublishAsync(ctx, in); err != nil {
			return err
		}
	}
	conflict := intents[len(intents)-1]
	conflict.Payload = effects.Intent{Account: 1, Amount: 777}.AppendJSON(nil)
	if err := pub.PublishAsync(ctx, conflict); err != nil {
		return err
	}
	if err := pub.Flush(ctx); err != nil {
		return err
	}
	say("replayed %d intents after the duplicate window, and reused 1 ID with a different payload", len(replays))

	err = pipeline.WaitSettled(ctx, js, streamOpts.Name, *durable, func(settled, total uint64) {
		fleet.progress(settled, total)
	})
	fleet.stopAll()
	if err != nil {
		return err
	}
	say("settled; verifying the stream against the inbox and the ledger")

	rep, err := demoVerify(context.WithoutCancel(ctx), nodes, js, verifyDB(store), verify.Options{Stream: streamOpts.Name, Scope: *scope, Durable: *durable, Ledger: true}, say)
	if err != nil {
		return err
	}
	ps := pub.Stats()
	cs := fleet.stats()
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(k string, v any, note string) { fmt.Fprintf(tw, "%s\t%v\t  %s\n", k, v, note) }
	fmt.Fprintln(stdout)
	row("intents", len(intents), "distinct IDs the producer meant to apply once")
	row("published", ps.Published, fmt.Sprintf("PubAcks received (incl. %d poison, %d replays, 1 conflict)", len(poison), len(replays)))
	row("publish retries", ps.Retries, "same ID, jittered backoff")
	row("server duplicates", ps.Duplicates, "dropped by JetStream inside its duplicate window")
	row("stream messages", rep.StreamMessages, "")
	row("delivered", cs.Received, "deliveries to consumers")
	row("duplicate deliveries", cs.Received-int64(rep.StreamMessages), "redeliveries after lost acks, a crash, AckWait")
	row("inbox duplicates", cs.Duplicates, "deliveries the inbox found already applied")
	row("applied once", rep.AppliedOnce, "")
	row("duplicated", rep.Duplicated, verify.Mark(rep.Duplicated == 0))
	row("lost", rep.Lost, verify.Mark(rep.Lost == 0))
	row("unexpected", rep.Unexpected, verify.Mark(rep.Unexpected == 0))
	row("dead-lettered", rep.DeadLettered, fmt.Sprintf("rejected %d, conflicts %d, with reasons", rep.Rejected, rep.Conflicts))
	row("consumer crashes", fleet.crashes, "restarted, as a supervisor would")
	row("store", store.Kind(), store.String())
	tw.Flush()
	for _, e := range rep.Examples {
		fmt.Fprintln(stdout, "  ", e)
	}
	if *httpHop && !*cluster {
		if err := demoHTTP(ctx, stdout, io.Discard); err != nil {
			fmt.Fprintf(stdout, "\nfinished in %.1fs\n", time.Since(start).Seconds())
			return err
		}
	}
	fmt.Fprintf(stdout, "\nfinished in %.1fs\n", time.Since(start).Seconds())
	if !rep.Clean() || rep.AppliedOnce != len(intents) {
		return errDemoFailed
	}
	if *withConsole {
		return demoConsole(userCtx, demoConsoleRun{js: js, store: store, stream: streamOpts.Name, scope: *scope, durable: *durable,
			applied: intents[len(intents)/2].ID, replayed: intents[0].ID, dead: poison[3].ID, conflict: conflict.ID,
			fleet: fleet, listen: *consoleAddr, screenshots: *shots}, stdout)
	}
	return nil
}

// setupStore migrates the inbox and the ledger, opens accounts
// 1..accounts and makes sure the stream exists.
func setupStore(ctx context.Context, js jetstream.JetStream, store *cli.Store, stream jsinbox.StreamConfig, accounts int) error {
	if _, _, err := store.Migrate(ctx); err != nil {
		return err
	}
	if err := store.SeedAccounts(ctx, accounts); err != nil {
		return err
	}
	_, err := jsinbox.EnsureStream(ctx, js, stream)
	return err
}

// demoStore opens the store the demo runs on: choice (-store) if given,
// else DATABASE_URL, else a throwaway PostgreSQL if its server binaries are
// installed, else a SQLite file in a temporary directory. It says which.
func demoStore(ctx context.Context, choice string, env cli.Env, say func(string, ...any)) (*cli.Store, func(), error) {
	why := "-store"
	if choice == "" {
		choice, why = env("DATABASE_URL"), "DATABASE_URL"
	}
	if choice == "" {
		choice, why = cli.StorePostgres, "PostgreSQL server binaries found"
		if _, err := testenv.FindPostgresBin(); err != nil {
			choice, why = cli.StoreSQLite, "no DATABASE_URL and no PostgreSQL server binaries"
		}
	}
	log := slog.New(slog.DiscardHandler)
	switch choice {
	case cli.StoreSQLite:
		dir, err := os.MkdirTemp("", "jetinbox-demo-")
		if err != nil {
			return nil, nil, fmt.Errorf("demo: %w", err)
		}
		path := filepath.Join(dir, "inbox.db")
		store, err := cli.OpenStore(ctx, "sqlite://"+path, 0, log)
		if err != nil {
			os.RemoveAll(dir)
			return nil, nil, err
		}
		say("store: SQLite %s (%s; WAL, synchronous=FULL). -store postgres or DATABASE_URL=postgres://… for PostgreSQL", path, why)
		return store, func() { store.Close(); os.RemoveAll(dir) }, nil
	case cli.StorePostgres:
		t0 := time.Now()
		pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Durable: true})
		if err != nil {
			return nil, nil, err
		}
		pool, err := demoPool(ctx, pg.URL("postgres"), "")
		if err != nil {
			pg.Close()
			return nil, nil, err
		}
		say("store: throwaway PostgreSQL on the Unix socket in %s, yours alone (%s; fsync on), started in %v. -store sqlite for a SQLite file",
			pg.SocketDir(), why, time.Since(t0).Round(time.Millisecond))
		return &cli.Store{PG: pool}, func() { pool.Close(); pg.Close() }, nil
	}
	if path, ok, err := cli.SQLitePath(choice); err != nil {
		return nil, nil, cli.UsageError{Err: fmt.Errorf("demo: %s: %w", why, err)}
	} else if ok {
		store, err := cli.OpenStore(ctx, choice, 0, log)
		if err != nil {
			return nil, nil, err
		}
		say("store: SQLite %s (from %s; WAL, synchronous=FULL)", path, why)
		return store, store.Close, nil
	}
	searchPath := "jetinbox_demo_" + strconv.FormatUint(rand.Uint64()>>28, 36)
	pool, err := demoPool(ctx, choice, searchPath)
	if err != nil {
		return nil, nil, err
	}
	say("store: PostgreSQL from %s, schema %s", why, searchPath)
	return &cli.Store{PG: pool}, pool.Close, nil
}

func demoPool(ctx context.Context, dbURL, searchPath string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, cli.UsageError{Err: fmt.Errorf("DATABASE_URL: %w", err)}
	}
	cfg.MaxConns = 16
	if searchPath != "" {
		c, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
		if err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
		_, err = c.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{searchPath}.Sanitize())
		c.Close(ctx)
		if err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = searchPath
	}
	pginbox.WatchCommits(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}

// poisonIntents are intents no retry can apply: each must end dead-lettered
// with its reason, without stalling its neighbours.
func poisonIntents(subject, run string) []inbox.Intent {
	bad := []string{
		`{"account":1,`,                        // malformed JSON
		`{"account":1,"amount":"5"}`,           // wrong type
		`{"account":1,"amount":5,"amount":6}`,  // duplicate key
		`{"account":999999,"amount":5}`,        // unknown account
		`{"account":1,"amount":-40}`,           // negative amount
		`{"account":1,"amount":5,"memo":"hi"}`, // unknown field
	}
	out := make([]inbox.Intent, len(bad))
	for i, p := range bad {
		out[i] = inbox.Intent{ID: "poison-" + run + "-" + strconv.Itoa(i), Subject: subject + ".poison", Payload: []byte(p)}
	}
	return out
}

// demoFleet runs consumers as a supervisor would: one that crashes is
// started again.
type demoFleet struct {
	natsURL string
	store   *cli.Store
	scope   string
	cfg     jsinbox.ConsumerConfig
	log     *slog.Logger
	say     func(string, ...any)

	mu       sync.Mutex
	all      []*jsinbox.Consumer
	stops    []context.CancelFunc
	wg       sync.WaitGroup
	crashes  int
	stopped  bool
	lastNote time.Time
}

func (f *demoFleet) start(ctx context.Context, id int, fp *failpoint.Set) error {
	nc, err := nats.Connect(f.natsURL, nats.MaxReconnects(-1), nats.Name("demo-consumer-"+strconv.Itoa(id)))
	if err != nil {
		return fmt.Errorf("demo: consumer %d: %w", id, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return err
	}
	proc, err := f.store.LedgerProcessor(inbox.Config{Scope: f.scope, Logger: f.log})
	if err != nil {
		nc.Close()
		return err
	}
	cfg := f.cfg
	c, err := jsinbox.NewConsumer(js, proc, cfg)
	if err != nil {
		nc.Close()
		return err
	}
	fp.Attach(proc, c)
	cctx, stop := context.WithCancel(ctx)
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		stop()
		nc.Close()
		return nil
	}
	f.all = append(f.all, c)
	f.stops = append(f.stops, stop)
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		err := c.Run(cctx)
		nc.Close() // a crashed process's connection dies with it
		if failpoint.IsCrash(err) && ctx.Err() == nil {
			f.mu.Lock()
			f.crashes++
			f.mu.Unlock()
			f.say("consumer %d crashed between COMMIT and ACK; its batch will be redelivered; restarting it", id)
			if err := f.start(ctx, id, failpoint.New()); err != nil {
				f.say("restart consumer %d: %v", id, err)
			}
		} else if err != nil && ctx.Err() == nil {
			f.say("consumer %d stopped: %v", id, err)
		}
	}()
	return nil
}

func (f *demoFleet) progress(settled, total uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.lastNote) < time.Second {
		return
	}
	f.lastNote = time.Now()
	var received, applied, dups, failed, inFlight int64
	for _, c := range f.all {
		s := c.Stats()
		received += s.Received
		applied += s.Applied
		dups += s.Duplicates
		failed += s.FailedBatches
		inFlight += s.InFlight
	}
	// Received, failed and in flight tell a stall apart: nothing
	// delivered, or delivered and not committed.
	f.say("consumers: %d applied, %d duplicates found by the inbox; ack floor %d of %d (received %d, batches in flight %d, failed %d)",
		applied, dups, settled, total, received, inFlight, failed)
}

func (f *demoFleet) stopAll() {
	f.mu.Lock()
	f.stopped = true
	for _, s := range f.stops {
		s()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *demoFleet) stats() jsinbox.ConsumerStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	var t jsinbox.ConsumerStats
	for _, c := range f.all {
		s := c.Stats()
		t.Received += s.Received
		t.Applied += s.Applied
		t.Duplicates += s.Duplicates
		t.DeadLettered += s.DeadLettered
	}
	return t
}
