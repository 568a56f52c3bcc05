// Package chaos runs producer strategies times consumer strategies, each
// under the same injected faults, on a real nats-server and a real
// PostgreSQL, and counts per intent what was lost, applied once and
// duplicated. Only stable IDs plus the inbox come out with lost=0 and
// duplicated=0.
package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/deliverchaos"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/outbox"
)

// Producer and consumer strategies.
var (
	Producers = []string{"once", "fresh-id", "stable-id", "stable-id-batch"}
	Consumers = []string{"ack-first", "effect-then-ack", "jetinbox"}
)

// Options of a chaos run.
type Options struct {
	Intents   int
	Producers []string
	Consumers []string
	// Fault rates.
	DropPublish, LosePubAck, Crash, LoseAck float64
	// Poison is the fraction of intents whose payload no effect can
	// apply: they must end dead-lettered, not lost.
	Poison float64
	// GiveUps is how many of the first intents a client takes through
	// every delivery the durable allows, dying on the last one while no
	// worker runs: the server gives up on them with nobody listening.
	GiveUps  int
	Restarts bool
	Seed     uint64
	Duration time.Duration
	// TwoHop also runs the two-hop pipeline (see RunTwoHop).
	TwoHop bool
	// Store is the store of the two-hop pipeline: "postgres" (or "") or
	// "sqlite" (a file of its own). The producer × consumer matrix runs on
	// PostgreSQL.
	Store string
	// RelayPublish is how the two-hop pipeline's relays publish: "atomic"
	// (or ""), "each" or "fast" (see outbox.ParsePublishMode); with "fast"
	// the notifications stream allows fast batches.
	RelayPublish string
	Progress     io.Writer
}

// Row is one combination's result, counted per intent: lost (neither
// applied nor dead-lettered), applied once, duplicated, dead-lettered.
type Row struct {
	Producer, Consumer string
	Intents            int
	Lost, AppliedOnce  int
	Duplicated         int
	DeadLettered       int
	Faults             string
	Elapsed            time.Duration
}

// Main is `jetinbox chaos`.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// -cluster switches to the three-node run, which has flags of its own.
	for i, a := range args {
		if a == "-cluster" || a == "--cluster" {
			return ClusterMain(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
		if n, ok := shardsFlag(args, i); ok {
			rest := slices.Delete(slices.Clone(args), i, i+1)
			if !strings.Contains(a, "=") && i+1 < len(args) {
				rest = slices.Delete(slices.Clone(args), i, i+2)
			}
			return ShardsMain(ctx, n, rest, stdout, stderr)
		}
		if a == "-pg-failover" || a == "--pg-failover" {
			return PGFailoverMain(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
		if a == "-http" || a == "--http" {
			return HTTPMain(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
		if a == "-deliver" || a == "--deliver" {
			return deliverchaos.Main(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
		if a == "-power-loss" || a == "--power-loss" {
			return PowerLossMain(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("jetinbox chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := Options{Progress: stderr}
	var prods, cons string
	fs.IntVar(&o.Intents, "intents", 2000, "intents per combination")
	fs.StringVar(&prods, "producers", strings.Join(Producers, ","), "producer strategies: once (no retry), fresh-id (retry with a new ID), stable-id (retry with the same ID), stable-id-batch (jsinbox's publisher in atomic batches)")
	fs.StringVar(&cons, "consumers", strings.Join(Consumers, ","), "consumer strategies: ack-first (ack, then effect), effect-then-ack (no inbox), jetinbox")
	fs.Float64Var(&o.DropPublish, "drop-publish", 0.03, "fraction of publishes lost before reaching the server")
	fs.Float64Var(&o.LosePubAck, "lose-puback", 0.03, "fraction of PubAcks lost on the way back")
	fs.Float64Var(&o.Crash, "crash", 0.05, "chance a consumer batch dies at a crash point (after fetch, after claim/effect before commit, after commit before ack)")
	fs.Float64Var(&o.LoseAck, "lose-ack", 0.05, "chance a batch's acks are lost")
	fs.Float64Var(&o.Poison, "poison", 0.01, "fraction of intents no effect can apply (must end dead-lettered)")
	fs.IntVar(&o.GiveUps, "give-ups", 20, "first intents the server gives up on after MaxDeliver while no worker listens")
	fs.BoolVar(&o.Restarts, "restarts", true, "restart the nats-server and PostgreSQL once each mid-run")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed for the fault dice")
	fs.BoolVar(&o.TwoHop, "two-hop", true, "also run the two-hop pipeline: intents → ledger emitting a notification per credit through the outbox → relays → notifications applied by a second scope, with the relays crashing before publish, in the PubAck wait and before marking")
	fs.StringVar(&o.Store, "store", "postgres", "the store of the two-hop pipeline: postgres or sqlite (a file of its own, with its outbox; no database restart there); the producer × consumer matrix runs on PostgreSQL")
	fs.StringVar(&o.RelayPublish, "relay-publish", "atomic", "how the two-hop pipeline's relays publish: atomic (a round's rows as atomic batches), each (each row on its own, pipelined) or fast (a round's rows as one JetStream fast batch; the notifications stream then allows them)")
	fs.DurationVar(&o.Duration, "duration", 0, "soak: repeat the stable-id × jetinbox combination with fresh intents until this long has passed")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox chaos: producer strategies × consumer strategies under lost publishes, lost PubAcks,\ncrashes at each crash point, lost acks, poison intents, give-ups after MaxDeliver while no worker\nlistens, two workers, a NATS and a PostgreSQL restart.\n"+
			"jetinbox chaos -cluster [flags]: the jetinbox row on three nats-server processes with R3 streams under\n"+
			"leader kills and pauses, step-downs, a rolling restart, a partition, a client whose server dies, a\n"+
			"consumer process paused past AckWait and a peer replaced (see jetinbox chaos -cluster -h).\n"+
			"jetinbox chaos -pg-failover [flags]: the jetinbox row on a pg_auto_failover primary and standby under\n"+
			"kills, failovers and cuts, synchronous and asynchronous (see jetinbox chaos -pg-failover -h).\n"+
			"jetinbox chaos -shards N [flags]: one partitioned stream over N shards, each on its own PostgreSQL, with a\n"+
			"shard's PostgreSQL killed and a partition moved mid-run (see jetinbox chaos -shards 3 -h).\n"+
			"jetinbox chaos -power-loss [flags]: the jetinbox row while the power goes out, every store on a filesystem\n"+
			"that forgets unsynced writes; shipped and unsafe settings side by side (see jetinbox chaos -power-loss -h).\n"+
			"jetinbox chaos -http [flags]: clients POST intents through a lossy proxy to jetinbox intake processes, never\n"+
			"retrying, retrying without a key, with the same key, and in concurrent bursts (see jetinbox chaos -http -h).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Producers, o.Consumers = strings.Split(prods, ","), strings.Split(cons, ",")
	if err := o.validate(fs.NArg()); err != nil {
		return cli.UsageError{Err: fmt.Errorf("chaos: %w", err)}
	}
	if o.Duration > 0 {
		o.Producers, o.Consumers = []string{"stable-id", "stable-id-batch"}, []string{"jetinbox"}
	}
	rows, reps, err := Run(ctx, o)
	if err != nil {
		return err
	}
	WriteTable(stdout, rows)
	for _, v := range reps {
		fmt.Fprintf(stdout, "\nverify on the final %s × jetinbox state:\n", v.Producer)
		v.Report.WriteTable(stdout)
	}
	for _, r := range rows {
		if Guaranteed(r) && (r.Lost > 0 || r.Duplicated > 0) {
			return fmt.Errorf("chaos: %s × jetinbox lost %d and duplicated %d intents", r.Producer, r.Lost, r.Duplicated)
		}
	}
	for _, v := range reps {
		if !v.Report.Clean() {
			return fmt.Errorf("chaos: verify found violations after %s × jetinbox", v.Producer)
		}
	}
	if o.TwoHop {
		th, err := RunTwoHop(ctx, o)
		if err != nil {
			return fmt.Errorf("chaos: two-hop: %w", err)
		}
		WriteTwoHop(stdout, th)
		if !th.Clean() {
			return errors.New("chaos: the two-hop pipeline lost, duplicated or added intents, or a check found violations")
		}
	}
	return nil
}

// validate reports every flag out of its range at once.
func (o Options) validate(extra int) error {
	var errs []error
	for _, p := range o.Producers {
		if !slices.Contains(Producers, p) {
			errs = append(errs, fmt.Errorf("-producers: unknown strategy %q", p))
		}
	}
	for _, c := range o.Consumers {
		if !slices.Contains(Consumers, c) {
			errs = append(errs, fmt.Errorf("-consumers: unknown strategy %q", c))
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"drop-publish", o.DropPublish}, {"lose-puback", o.LosePubAck}, {"crash", o.Crash}, {"lose-ack", o.LoseAck}, {"poison", o.Poison}} {
		if !(f.v >= 0 && f.v < 1) { // also refuses NaN
			errs = append(errs, fmt.Errorf("-%s %v: want a fraction in [0, 1)", f.name, f.v))
		}
	}
	if o.Intents < 1 {
		errs = append(errs, fmt.Errorf("-intents %d: must be at least 1", o.Intents))
	}
	if o.GiveUps < 0 || o.GiveUps > o.Intents {
		errs = append(errs, fmt.Errorf("-give-ups %d: want 0 to -intents (%d)", o.GiveUps, o.Intents))
	}
	if o.RelayPublish != "" {
		if _, err := outbox.ParsePublishMode(o.RelayPublish); err != nil {
			errs = append(errs, fmt.Errorf("-relay-publish: %w", err))
		}
	}
	if o.Store != "" && o.Store != "postgres" && o.Store != "sqlite" {
		errs = append(errs, fmt.Errorf("-store %q: want postgres or sqlite", o.Store))
	}
	if o.Duration < 0 {
		errs = append(errs, fmt.Errorf("-duration %v: must not be negative", o.Duration))
	}
	if extra > 0 {
		errs = append(errs, errors.New("unexpected arguments"))
	}
	return errors.Join(errs...)
}

// Guaranteed reports whether a row runs a combination the guarantee covers:
// stable IDs, published one by one or in atomic batches, into the inbox.
func Guaranteed(r Row) bool {
	return strings.HasPrefix(r.Producer, "stable-id") && r.Consumer == "jetinbox"
}

// Verified is verify's report on the end state of a guaranteed row.
type Verified struct {
	Producer string
	Report   *verify.Report
}

// WriteTable prints the rows as a table.
func WriteTable(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "producer\tconsumer\tintents\tlost\tapplied once\tduplicated\tdead-lettered\ttime\tfaults")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%.1fs\t%s\n", r.Producer, r.Consumer, r.Intents, r.Lost, r.AppliedOnce, r.Duplicated, r.DeadLettered, r.Elapsed.Seconds(), r.Faults)
	}
	tw.Flush()
}

// Run runs every combination and returns the rows, plus verify's report on
// the end state of every guaranteed row.
func Run(ctx context.Context, o Options) ([]Row, []Verified, error) {
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		return nil, nil, err
	}
	defer pg.Close()
	var rows []Row
	var reps []Verified
	start := time.Now()
	round := 0
	for {
		for _, p := range o.Producers {
			for _, c := range o.Consumers {
				round++
				row, r, err := runOne(ctx, pg, o, p, c, round)
				if err != nil {
					return rows, nil, fmt.Errorf("chaos %s × %s: %w", p, c, err)
				}
				rows = append(rows, row)
				if r != nil {
					reps = append(reps, Verified{Producer: p, Report: r})
				}
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "%-10s × %-16s lost=%-5d applied once=%-7d duplicated=%-5d (%.1fs)\n", p, c, row.Lost, row.AppliedOnce, row.Duplicated, row.Elapsed.Seconds())
				}
			}
		}
		if o.Duration == 0 || time.Since(start) > o.Duration || ctx.Err() != nil {
			return rows, reps, ctx.Err()
		}
	}
}
