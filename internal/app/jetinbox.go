// Package app holds the jetinbox operator CLI: the dispatcher and the
// commands demo, migrate, verify, replay and prune, with bench, chaos and
// jitter from their own packages. It links the embedded nats-server, the
// throwaway PostgreSQL, the chart library and testing (through testenv);
// the consumer and producer binaries use package cli and never this one.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/delivery/sqlitedelivery"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/bench"
	"github.com/jetinbox/jetinbox/internal/chaos"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/intake"
	"github.com/jetinbox/jetinbox/internal/jittersim"
	"github.com/jetinbox/jetinbox/internal/jscheck"
	"github.com/jetinbox/jetinbox/internal/verify"
)

type command struct {
	summary string
	run     func(ctx context.Context, args []string, env cli.Env, stdin io.Reader, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		"demo":     {"the all-in-one run: embedded JetStream, a throwaway PostgreSQL (or a SQLite file), producer, two consumers, faults, verified result", Demo},
		"accounts": {"open ledger accounts (-open 1-1024), or list them with their balances (-list)", Accounts},
		"dlq":      {"list a scope's dead letters by reason, -show one, -redrive a selection after fixing the cause", DLQ},
		"console":  {"serve the operator console: overview, an intent's timeline by ID or HTTP key, dead letters and re-drive, verify, partitions", Console},
		"migrate":  {"apply the inbox, ledger and outbox schemas (-print shows the SQL instead)", Migrate},
		"relay":    {"publish the outbox's pending rows (follow-ups, services' own intents) with their IDs and mark them sent", Relay},
		"deliver":  {"send the deliveries effects decided (webhooks, APIs) with stable idempotency keys until their outcome is known", Deliver},
		"verify":   {"check a stream against one scope's inbox and ledger: lost, duplicated, unexpected", Verify},
		"intake":   {intake.Summary, intake.Main},
		"consumer": {"the consumer (same as the consumer binary), for one-binary deployments and jetinbox bench", func(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
			return cli.Consumer(ctx, args, env, stdout, stderr)
		}},
		"partitions": {"a sharded stream's partitions: list who owns them, create the stream, move one to another shard while running", Partitions},
		"replay":     {"run a stream range through the inbox again, rolled back unless -apply: what would it change?", Replay},
		"prune":      {"delete one scope's inbox rows older than a horizon the servers say is safe", Prune},
		"bench": {"raw pipe vs naive vs jetinbox on the same messages, with latency and memory", func(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
			return bench.Main(ctx, args, stdout, cli.ProgressWriter(stderr, env))
		}},
		"chaos": {"producer strategies × consumer strategies under faults, on real servers", func(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
			return chaos.Main(ctx, args, stdout, cli.ProgressWriter(stderr, env))
		}},
		"jitter": {"a retry storm of 1000 clients under each jitter policy, plus an overloaded server; -chart FILE draws it", func(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
			return jittersim.Main(ctx, args, stdout, cli.ProgressWriter(stderr, env))
		}},
	}
}

// Jetinbox is the operator CLI: `jetinbox <command> [flags]`.
func Jetinbox(ctx context.Context, args []string, env cli.Env, stdin io.Reader, stdout, stderr io.Writer) error {
	cmds := commands()
	usage := func() {
		fmt.Fprintln(stderr, "jetinbox: effectively-once side effects from at-least-once JetStream delivery.\n\nUsage: jetinbox <command> [flags]\n\nCommands:")
		names := make([]string, 0, len(cmds))
		for n := range cmds {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(stderr, "  %-8s %s\n", n, cmds[n].summary)
		}
		fmt.Fprintln(stderr, "\nRun `jetinbox <command> -h` for a command's flags.\n\n"+cli.ExitCodes)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		if len(args) == 0 {
			return cli.UsageError{Err: errors.New("no command given")}
		}
		return nil
	}
	c, ok := cmds[args[0]]
	if !ok {
		usage()
		return cli.UsageError{Err: fmt.Errorf("unknown command %q", args[0])}
	}
	err := cli.MigrateHint(c.run(ctx, args[1:], env, stdin, stdout, stderr))
	if errors.Is(err, flag.ErrHelp) && !ownUsage[args[0]] {
		fmt.Fprintf(stderr, "\n%s\n", cli.ExitCodes)
	}
	return err
}

// ownUsage names the commands whose usage text (cli.NewFlagSet) already
// ends with the exit-code convention; the dispatcher adds it to the others'.
var ownUsage = map[string]bool{"console": true, "demo": true, "accounts": true, "dlq": true, "migrate": true, "verify": true, "consumer": true, "replay": true, "prune": true, "relay": true, "deliver": true, "partitions": true, "intake": true}

// Migrate applies the schemas, or prints them.
func Migrate(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox migrate", "Apply the inbox, ledger and outbox schemas to DATABASE_URL (PostgreSQL, or a SQLite file: sqlite:///path). Nothing migrates implicitly.", stderr)
	dbURL := cli.DatabaseFlag(fs, env, cli.DatabaseUsage)
	print := fs.Bool("print", false, "print the SQL for your own migration tool instead of applying it")
	status := fs.Bool("status", false, "list each migration as applied, pending, edited (applied with other SQL: exit 1) or unknown (from a newer release); apply nothing")
	var sf cli.ShardFlags
	sf.Register(fs, env)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if (sf.File != "" || sf.Name != "") && !*print && !*status {
		return migrateShard(ctx, sf, env, stdout, stderr)
	}
	if *print {
		if cli.StoreKind(*dbURL) == cli.StoreSQLite {
			fmt.Fprint(stdout, sqliteinbox.New(nil).MigrationSQL(), effects.MigrationSQLSQLite(), sqliteinbox.New(nil).Outbox().MigrationSQL(), sqlitedelivery.New(nil).MigrationSQL())
			return nil
		}
		fmt.Fprint(stdout, pginbox.New(nil).MigrationSQL(), effects.MigrationSQL(), pginbox.New(nil).Outbox().MigrationSQL(), pgdelivery.New(nil).MigrationSQL())
		return nil
	}
	if err := cli.RequireDatabase(*dbURL); err != nil {
		return err
	}
	store, err := cli.OpenStore(ctx, *dbURL, 2, cli.EnvLogger(stderr, env, slog.LevelInfo))
	if err != nil {
		return err
	}
	defer store.Close()
	if *status {
		return migrationStatus(ctx, store, stdout)
	}
	n, m, err := store.Migrate(ctx)
	if err != nil {
		return err
	}
	o, err := store.Outbox().Migrate(ctx)
	if err != nil {
		return err
	}
	dl, err := store.DeliveryStore().Migrate(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "applied %d inbox, %d ledger and %d outbox migrations; %d delivery migrations\n", n, m, o, dl)
	return nil
}

// errViolations makes verify exit 1 when it found violations.
var errViolations = errors.New("verify: invariants broken")

// Verify reads the stream and checks the inbox and ledger against it.
func Verify(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox verify", "Check that every message in the stream was applied once or dead-lettered, for one inbox scope.\n"+
		"A dead letter counts only if its headers name the stream, the scope, a stream sequence and that message's ID.\n"+
		"A message the server gave up on whose advisory the -durable's rescue has not settled yet is awaiting rescue, not lost\n"+
		"(no violation; a warning says when it has waited too long).\n"+
		"Exit 0 clean, 1 violations, 2 usage or connection errors (a reversed range is a usage error).", stderr)
	var nf cli.NATSFlags
	nf.Register(fs, env)
	dbURL := cli.DatabaseFlag(fs, env, cli.DatabaseUsage)
	stream := cli.StreamFlag(fs, env, "intents stream")
	scope := cli.ScopeFlag(fs, env)
	durable := cli.DurableFlag(fs, env)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	fromSeq := fs.Uint64("from-seq", 0, "check from this stream sequence (0: the start)")
	toSeq := fs.Uint64("to-seq", 0, "check up to this stream sequence (0: the end)")
	fromTime := fs.String("from-time", "", "check from this RFC 3339 time")
	toTime := fs.String("to-time", "", "check up to this RFC 3339 time")
	retention := fs.Duration("retention", 0, "the inbox retention in use (Prune OlderThan), to check against the stream's horizons; 0: never pruned")
	nakCap := fs.Duration("nak-cap", jsinbox.DefaultNakCap, "the consumer's longest nak delay, for the redelivery horizon")
	redrive := fs.Bool("dlq-redrive", true, "count dead-letter re-drives in the horizon, as jetinbox prune does")
	watch := fs.Bool("watch", false, "keep running: every -interval, check the messages after the checkpoint up to the durable's ack floor (settled ones only) and export jetinbox_verify_violations{kind} and friends on -http; range flags do not apply")
	interval := fs.Duration("interval", 5*time.Minute, "-watch: time between rounds")
	httpAddr := fs.String("http", "127.0.0.1:9091", "-watch: address for /metrics and /healthz (loopback only by default; 0.0.0.0:9091 to serve a scraper elsewhere); empty disables")
	checkpoint := fs.String("checkpoint", "", "-watch: keep the checkpoint (last sequence checked, violations so far) in this file across restarts; empty: in memory, a restart checks the stream from its start again")
	textfile := fs.String("textfile", "", "also write jetinbox_verify_violations{kind} to this file in Prometheus text format (node_exporter's textfile collector); the JetinboxVerifyViolations alert reads the verify service's job (-watch), so point its job matcher here if you use this instead")
	nextStream := fs.String("next-stream", "", "also check the chain into this stream: every applied message of -scope has its follow-up (ID <kind>:<message ID>, see -follow-up-kind) in it exactly once by ID, "+
		"nothing is in it without an applied parent, and -next-scope applied each once")
	nextScope := fs.String("next-scope", "", "-next-stream: the inbox scope that applies the follow-ups (its ledger entries are counted); empty: only the stream is checked")
	kind := fs.String("follow-up-kind", "notify", "-next-stream: the kind of the follow-ups")
	var sf cli.ShardFlags
	sf.Register(fs, env)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if sf.File != "" {
		if *watch || *nextStream != "" || *textfile != "" {
			return cli.UsageError{Err: errors.New("verify -shards checks all shards once: no -watch, -next-stream or -textfile")}
		}
		return verifyShards(ctx, sf, &nf, env, *asJSON, stdout, stderr)
	}
	if *nextStream != "" && *watch {
		return cli.UsageError{Err: errors.New("verify: -next-stream is not checked by -watch")}
	}
	if *nextScope != "" {
		if err := cli.CheckScope(*nextScope); err != nil {
			return err
		}
	}
	rg := verify.Range{FromSeq: *fromSeq, ToSeq: *toSeq}
	for _, t := range []struct {
		flag string
		val  string
		dst  *time.Time
	}{{"-from-time", *fromTime, &rg.FromTime}, {"-to-time", *toTime, &rg.ToTime}} {
		if t.val == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.val)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("%s: %w", t.flag, err)}
		}
		*t.dst = v
	}
	if err := rg.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	if *watch && (rg.Partial() || *textfile != "" || *asJSON) {
		return cli.UsageError{Err: errors.New("verify: -watch takes no range, -textfile or -json: it checks what the durable settles and serves /metrics")}
	}
	if *watch && (*interval <= 0 || *durable == "") {
		return cli.UsageError{Err: errors.New("verify: -watch needs a positive -interval and a -durable")}
	}
	if err := nf.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	if err := cli.CheckScope(*scope); err != nil {
		return err
	}
	if err := cli.RequireDatabase(*dbURL); err != nil {
		return err
	}
	log := cli.EnvLogger(stderr, env, slog.LevelInfo)
	store, err := cli.OpenStore(ctx, *dbURL, 4, log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer store.Close()
	nc, js, err := nf.Connect("jetinbox-verify", cli.DefaultReconnect(), log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer nc.Close()
	if *watch {
		return watchVerify(ctx, js, verifyDB(store), verify.Options{Stream: *stream, Scope: *scope, Durable: *durable, Ledger: true,
			Horizon: jscheck.HorizonOptions{Retention: *retention, NakCap: *nakCap, Redrive: *redrive}}, *checkpoint, *httpAddr, *interval, log)
	}
	var progress func(read, total uint64)
	if f, ok := stderr.(*os.File); ok && cli.IsTerminal(f) {
		progress = func(read, total uint64) {
			const width = 40
			n := int(float64(width) * float64(read) / float64(max(total, 1)))
			fmt.Fprintf(stderr, "\rreading %s [%s%s] %d/%d", *stream, strings.Repeat("#", n), strings.Repeat(".", width-n), read, total)
			if read >= total {
				fmt.Fprintln(stderr)
			}
		}
	}
	r, err := verify.RunOn(ctx, js, verifyDB(store), verify.Options{Stream: *stream, Scope: *scope, Durable: *durable, Ledger: true,
		Range: rg, Horizon: jscheck.HorizonOptions{Retention: *retention, NakCap: *nakCap, Redrive: *redrive}, Progress: progress})
	if err != nil {
		return cli.UsageError{Err: streamMissing("verify", *stream, err)}
	}
	if *textfile != "" {
		if err := writeVerifyMetrics(*textfile, r); err != nil {
			return err
		}
	}
	var chain *verify.ChainReport
	co := verify.ChainOptions{ParentScope: *scope, Kind: *kind, Stream: *nextStream, Scope: *nextScope, Ledger: true}
	if *nextStream != "" {
		if chain, err = verify.Chain(ctx, js, verifyDB(store), co); err != nil {
			return cli.UsageError{Err: streamMissing("verify", *nextStream, err)}
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		var v any = r
		if chain != nil {
			v = struct {
				Report *verify.Report      `json:"report"`
				Chain  *verify.ChainReport `json:"chain"`
			}{r, chain}
		}
		if err := enc.Encode(v); err != nil {
			return err
		}
	} else {
		r.WriteTable(stdout)
		if chain != nil {
			fmt.Fprintf(stdout, "\nchain: follow-ups of scope %q in %s:\n", *scope, *nextStream)
			chain.WriteTable(stdout, co)
		}
	}
	if !r.Clean() || (chain != nil && !chain.Clean()) {
		return errViolations
	}
	return nil
}

// writeVerifyMetrics writes the report's violation counts by kind for
// Prometheus, in the shape verify -watch serves them.
func writeVerifyMetrics(path string, r *verify.Report) error {
	reg := prometheus.NewRegistry()
	v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: verify.MetricViolations,
		Help: "Broken invariants found by the last jetinbox verify, by kind (lost, duplicated, unexpected, effect_without_row, row_without_effect, balance_mismatch, expired_before_rescue)."}, []string{"kind"})
	ts := prometheus.NewGauge(prometheus.GaugeOpts{Name: verify.MetricLastRun, Help: "When jetinbox verify last finished."})
	reg.MustRegister(v, ts)
	for k, n := range r.Violations() {
		v.WithLabelValues(k).Set(float64(n))
	}
	ts.SetToCurrentTime()
	if err := prometheus.WriteToTextfile(path, reg); err != nil {
		return fmt.Errorf("verify: -textfile: %w", err)
	}
	return nil
}

// migrationStatus prints every migration's state; an edited one fails.
func migrationStatus(ctx context.Context, store *cli.Store, stdout io.Writer) error {
	in, led, err := store.MigrationStatus(ctx)
	if err != nil {
		return err
	}
	out, err := store.Outbox().MigrationStatus(ctx)
	if err != nil {
		return err
	}
	led = append(led, out...)
	edited := 0
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "component\tversion\tfile\tstate")
	for _, st := range append(in, led...) {
		state := "applied"
		switch {
		case st.Edited:
			state, edited = "EDITED after it was applied", edited+1
		case st.Unknown:
			state = "applied by a newer release"
		case st.Pending:
			state = "pending"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", st.Component, st.Version, st.Name, state)
	}
	tw.Flush()
	if edited > 0 {
		return fmt.Errorf("migrate: %d applied migrations were edited afterwards", edited)
	}
	return nil
}

// verifyDB is verify's view of the store's database.
func verifyDB(s *cli.Store) verify.DB {
	if s.SQLite != nil {
		return verify.SQLite(s.SQLite)
	}
	return verify.Postgres(s.PG)
}
