package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/shard"
)

// ShardFlags are -shards FILE and -shard NAME: run, migrate or check one
// shard of a partitioned stream as the map file describes it.
type ShardFlags struct {
	File, Name string
	// PartitionBatches: the consumer's -partition-batches.
	PartitionBatches bool
}

// Register registers -shards and -shard.
func (f *ShardFlags) Register(fs FlagSet, env Env) {
	fs.StringVar(&f.File, "shards", env("JETINBOX_SHARDS"), "shard map file of a partitioned stream (env JETINBOX_SHARDS); with -shard, the stream, scope, durables and database come from it")
	fs.StringVar(&f.Name, "shard", env("JETINBOX_SHARD"), "the shard of -shards this process runs (env JETINBOX_SHARD)")
}

// Load reads the map and, when needName, the shard; a missing or bad map
// is a usage error.
func (f *ShardFlags) Load(needName bool) (*shard.Map, *shard.Shard, error) {
	if f.File == "" {
		return nil, nil, UsageError{Err: errors.New("-shard needs -shards FILE")}
	}
	m, err := shard.Load(f.File)
	if err != nil {
		return nil, nil, UsageError{Err: err}
	}
	if !needName && f.Name == "" {
		return m, nil, nil
	}
	if f.Name == "" {
		return nil, nil, UsageError{Err: errors.New("-shards needs -shard NAME: the shard this process runs")}
	}
	s, err := m.Shard(f.Name)
	if err != nil {
		return nil, nil, UsageError{Err: err}
	}
	return m, s, nil
}

// OpenShard opens a shard's database, which must be PostgreSQL: shards
// are primaries of their own, and a move copies rows between them.
func OpenShard(ctx context.Context, s *shard.Shard, env Env, maxConns int32, log *slog.Logger) (*Store, error) {
	u, err := s.URL(env)
	if err != nil {
		return nil, UsageError{Err: err}
	}
	if StoreKind(u) != StorePostgres {
		return nil, UsageError{Err: fmt.Errorf("shard %q: a shard's database is PostgreSQL, not %s", s.Name, StoreKind(u))}
	}
	st, err := OpenStore(ctx, u, maxConns, log)
	if err != nil {
		return nil, fmt.Errorf("shard %q: %w", s.Name, err)
	}
	return st, nil
}

// ShardLedgerProcessor returns the processor of shard map m's ledger on
// this store (a shard's PostgreSQL): the binding check ([shard.Processor])
// over the inbox processor whose effect runs behind the fence
// ([shard.Fenced]), so a partition the database does not own is applied in
// no transaction. It owns no partition until SetOwned. With dryRun, every
// commit rolls back (replay's dry run).
func (s *Store) ShardLedgerProcessor(m *shard.Map, cfg inbox.Config, dryRun bool) (*shard.Processor, error) {
	if s.PG == nil {
		return nil, UsageError{Err: errors.New("a shard's database is PostgreSQL")}
	}
	led, err := effects.NewScopedLedger(m.Scope)
	if err != nil {
		return nil, err
	}
	cfg.Scope = m.Scope
	var st driver.Store[pgx.Tx] = pginbox.New(s.PG)
	if dryRun {
		st = rollbackStore[pgx.Tx]{st}
	}
	inner, err := inbox.NewProcessor(st, inbox.Handler[pgx.Tx](&shard.Fenced{Map: m, Inner: led}), cfg)
	if err != nil {
		return nil, err
	}
	return shard.NewProcessor(inner, m), nil
}

// RefuseSharded refuses a database that holds the partition table of a
// sharded stream with rows for scope: a process that applies there
// without the shard map (-shards) would apply every partition, outside
// the fence, and one a move gave away would be applied in two shards.
func (s *Store) RefuseSharded(ctx context.Context, scope, what string) error {
	if s.PG == nil {
		return nil
	}
	var sharded bool
	err := s.PG.QueryRow(ctx, `SELECT to_regclass('jetinbox_partitions') IS NOT NULL`).Scan(&sharded)
	if err == nil && sharded {
		err = s.PG.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM jetinbox_partitions WHERE scope = $1)`, scope).Scan(&sharded)
	}
	if err != nil {
		return fmt.Errorf("%s: is the database a shard's: %w", what, err)
	}
	if sharded {
		return UsageError{Err: fmt.Errorf("%s: the database is a shard of a sharded stream (its jetinbox_partitions table has rows for scope %q): "+
			"run it with -shards FILE -shard NAME, which applies only the partitions the shard owns, behind the fence of a move", what, scope)}
	}
	return nil
}

// batchOnly hides an observer's Attach: the partition consumers share one
// observer, whose counters add up; its gauges follow one consumer only.
type batchOnly struct{ jsinbox.Observer }

// consumeShard runs one shard of a partitioned stream: a consumer per
// partition its database owns, started and stopped as partitions move.
func consumeShard(ctx context.Context, sf ShardFlags, env Env, nf *NATSFlags, w waits, cfg jsinbox.ConsumerConfig, pcfg inbox.Config,
	dbConns int, httpAddr string, reg *prometheus.Registry, drainTimeout time.Duration, log *slog.Logger) error {
	m, s, err := sf.Load(true)
	if err != nil {
		return err
	}
	store, err := OpenShard(ctx, s, env, int32(dbConns), log)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.CheckSchema(ctx); err != nil {
		return err
	}
	if _, err := shard.Owned(ctx, store.PG, m.Scope); err != nil {
		return UsageError{Err: fmt.Errorf("%w: run jetinbox migrate -shards %s -shard %s", err, sf.File, sf.Name)}
	}
	nc, js, err := nf.Connect("jetinbox-consumer-"+s.Name, w.natsReconnect, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	proc, err := store.ShardLedgerProcessor(m, pcfg, false)
	if err != nil {
		return err
	}
	if cfg.Observer != nil {
		cfg.Observer = batchOnly{cfg.Observer}
	}
	// The memory budget is the process's: the runner shares it out over
	// the partitions the database says the shard owns.
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = jsinbox.DefaultConsumerMaxBytes
	}
	r := &shard.Runner{JS: js, Pool: store.PG, Map: m, Name: s.Name, Proc: proc, Consumer: cfg, MaxBytes: cfg.MaxBytes, Logger: log, PartitionBatches: sf.PartitionBatches}
	if httpAddr != "" {
		srv, err := serveShardHTTP(httpAddr, r, nc, reg, log)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	log.Info("consumer: running a shard", "shard", s.Name, "stream", m.Stream, "scope", m.Scope, "partitions", s.Partitions.String(), "batch", cfg.BatchSize, "inflight", cfg.InFlight)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		log.Info("consumer: draining", "timeout", drainTimeout)
		cancel()
		select {
		case err = <-done:
		case <-time.After(drainTimeout):
			return fmt.Errorf("in-flight batches did not finish within %v; unacked messages will be redelivered", drainTimeout)
		}
	}
	if err != nil {
		return err
	}
	if err := nc.Drain(); err != nil {
		log.Warn("nats: drain", "err", err)
	}
	log.Info("consumer: stopped", "shard", s.Name)
	return nil
}

// serveShardHTTP serves /metrics and /healthz as the consumer does, and
// /readyz (see shardHTTPHandler).
func serveShardHTTP(addr string, r *shard.Runner, nc *nats.Conn, reg *prometheus.Registry, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http: %w", err)
	}
	srv := &http.Server{Handler: shardHTTPHandler(r, nc, reg), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http", "err", err)
		}
	}()
	log.Info("http: serving", "addr", ln.Addr().String())
	return srv, nil
}

// shardHTTPHandler is what serveShardHTTP serves: /readyz says whether
// every partition the shard runs is consuming and, as the consumer's does,
// the rescue backlog (max-deliveries advisories not yet settled), summed
// over the partitions, with the partitions that have one. A backlog does
// not make the shard unready: it is the one that rescues them.
func shardHTTPHandler(r *shard.Runner, nc *nats.Conn, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", httpHandler(nil, nc, reg))
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		backlog := ""
		if by, n, _ := r.RescueBacklog(ctx); n > 0 {
			parts := make([]string, 0, len(by))
			for _, p := range slices.Sorted(maps.Keys(by)) {
				parts = append(parts, fmt.Sprintf("%d: %d", p, by[p]))
			}
			backlog = fmt.Sprintf("\nrescue backlog: %d max-deliveries advisories not yet settled (jetinbox_rescue_backlog), by partition %s", n, strings.Join(parts, ", "))
		}
		if !r.Ready() {
			http.Error(w, "not ready: a partition is not consuming, or NATS or PostgreSQL unreachable"+backlog, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready"+backlog)
	})
	return mux
}
