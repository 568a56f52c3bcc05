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
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/effects"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
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
	Progress io.Writer
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
	fs.DurationVar(&o.Duration, "duration", 0, "soak: repeat the stable-id × jetinbox combination with fresh intents until this long has passed")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox chaos: producer strategies × consumer strategies under lost publishes, lost PubAcks,\ncrashes at each crash point, lost acks, poison intents, give-ups after MaxDeliver while no worker\nlistens, two workers, a NATS and a PostgreSQL restart.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Producers, o.Consumers = strings.Split(prods, ","), strings.Split(cons, ",")
	for _, p := range o.Producers {
		if !slices.Contains(Producers, p) {
			return fmt.Errorf("chaos: unknown producer strategy %q", p)
		}
	}
	for _, c := range o.Consumers {
		if !slices.Contains(Consumers, c) {
			return fmt.Errorf("chaos: unknown consumer strategy %q", c)
		}
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
	return nil
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

type run struct {
	o       Options
	pg      *testenv.Postgres
	nats    *testenv.NATS
	js      jetstream.JetStream
	pool    *pgxpool.Pool
	intents []jsinbox.Intent
	dice    *rand.Rand
	diceMu  sync.Mutex
	faults  map[string]*atomic.Int64
	stream  string
	batches atomic.Int64 // batches fetched by the naive workers of this run
}

func (r *run) roll(p float64) bool {
	r.diceMu.Lock()
	defer r.diceMu.Unlock()
	return r.dice.Float64() < p
}

func (r *run) fault(name string) {
	r.faults[name].Add(1)
}

func runOne(ctx context.Context, pg *testenv.Postgres, o Options, prod, cons string, round int) (Row, *verify.Report, error) {
	start := time.Now()
	r := &run{o: o, pg: pg, stream: jsinbox.DefaultStream, dice: rand.New(rand.NewPCG(o.Seed, uint64(round))), faults: map[string]*atomic.Int64{}}
	for _, f := range faultNames {
		r.faults[f] = &atomic.Int64{}
	}
	var err error
	if r.nats, err = testenv.StartNATS(testenv.NATSOptions{}); err != nil {
		return Row{}, nil, err
	}
	defer r.nats.Close()
	nc, err := nats.Connect(r.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return Row{}, nil, err
	}
	defer nc.Close()
	r.js, _ = jetstream.New(nc)
	url, err := pg.CreateDatabase(ctx, fmt.Sprintf("chaos_%d_%s_%s", round, strings.ReplaceAll(prod, "-", "_"), strings.ReplaceAll(cons, "-", "_")))
	if err != nil {
		return Row{}, nil, err
	}
	if r.pool, err = pgxpool.New(ctx, url); err != nil {
		return Row{}, nil, err
	}
	defer r.pool.Close()
	if err := pipeline.Setup(ctx, r.js, r.pool, jsinbox.StreamConfig{}, 64); err != nil {
		return Row{}, nil, err
	}
	r.intents = pipeline.Generate(pipeline.Load{Count: o.Intents, Accounts: 64, Prefix: fmt.Sprintf("c%d", round), Seed: o.Seed + uint64(round)})
	if o.Poison > 0 {
		every := max(1, int(1/o.Poison))
		for i := every / 2; i < len(r.intents); i += every {
			r.intents[i].Payload = []byte(`{"account":1,"amount":`) // no effect can apply it
			r.fault("poison intents")
		}
	}

	// Two workers on one durable, under faults.
	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	durable := "ledger"
	if _, err := r.js.CreateConsumer(ctx, r.stream, jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Second, MaxDeliver: 50, MaxAckPending: 2000}); err != nil {
		stopWorkers()
		return Row{}, nil, err
	}
	// The first intents meet the server's give-up while no worker runs.
	first := min(o.GiveUps, len(r.intents))
	if first > 0 {
		if err := r.produce(ctx, prod, r.intents[:first], func(int) {}); err != nil {
			stopWorkers()
			return Row{}, nil, err
		}
		if err := r.giveUpUnheard(ctx, nc, durable); err != nil {
			stopWorkers()
			return Row{}, nil, err
		}
	}
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.supervise(wctx, cons, durable, w)
		}()
	}

	// Produce the rest, with a NATS restart halfway through.
	restartNATS := o.Restarts
	perr := r.produce(ctx, prod, r.intents[first:], func(i int) {
		if restartNATS && first+i == len(r.intents)/2 {
			restartNATS = false
			r.fault("restarts")
			_ = r.nats.Restart()
		}
	})
	if perr != nil {
		stopWorkers()
		wg.Wait()
		return Row{}, nil, perr
	}
	if o.Restarts {
		r.fault("restarts")
		_ = pg.Stop()
		time.Sleep(500 * time.Millisecond) // the outage
		if err := pg.Start(ctx); err != nil {
			stopWorkers()
			wg.Wait()
			return Row{}, nil, err
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	err = pipeline.WaitSettled(sctx, r.js, r.stream, durable, nil)
	cancel()
	stopWorkers()
	wg.Wait()
	if err != nil {
		return Row{}, nil, err
	}

	row := Row{Producer: prod, Consumer: cons, Intents: len(r.intents), Elapsed: time.Since(start)}
	if err := r.count(ctx, &row); err != nil {
		return Row{}, nil, err
	}
	var fs []string
	for _, f := range faultNames {
		fs = append(fs, fmt.Sprintf("%d %s", r.faults[f].Load(), f))
	}
	row.Faults = strings.Join(fs, ", ")
	var rep *verify.Report
	if Guaranteed(row) {
		if rep, err = verify.Run(ctx, r.js, r.pool, verify.Options{Scope: effects.DefaultScope, Durable: durable, Ledger: true}); err != nil {
			return Row{}, nil, err
		}
	}
	return row, rep, nil
}

// faultNames are the faults a row counts, in the order it shows them.
var faultNames = []string{"dropped publishes", "lost PubAcks", "crashes", "lost acks", "restarts", "poison intents", "unheard give-ups"}

// produce publishes intents by the producer strategy, under dropped
// publishes and lost PubAcks. Publishes are synchronous, but for the batch
// strategy: the point is the protocol, not speed.
func (r *run) produce(ctx context.Context, strategy string, intents []jsinbox.Intent, each func(i int)) error {
	if strategy == "stable-id-batch" {
		return r.produceBatches(ctx, intents, each)
	}
	for i, in := range intents {
		each(i)
		id := in.ID
		for attempt := 0; attempt < 20; attempt++ {
			if strategy == "fresh-id" && attempt > 0 {
				id = in.ID + "~r" + strconv.Itoa(attempt) // a new ID per retry: what a client without a key does
			}
			ok := false
			if r.roll(r.o.DropPublish) {
				r.fault("dropped publishes")
			} else {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := r.js.PublishMsg(pctx, &nats.Msg{Subject: in.Subject, Data: in.Payload, Header: nats.Header{jetstream.MsgIDHeader: []string{id}}})
				cancel()
				if err == nil {
					if r.roll(r.o.LosePubAck) {
						r.fault("lost PubAcks")
					} else {
						ok = true
					}
				}
			}
			if ok || strategy == "once" {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.diceMu.Lock()
			d := time.Duration(r.dice.Int64N(int64(20 * time.Millisecond)))
			r.diceMu.Unlock()
			time.Sleep(d) // jittered, short: this is a test
		}
	}
	return nil
}

// produceBatches publishes through jsinbox's Publisher in atomic batches,
// whose messages the stream stores with their Nats-Batch-* headers. Lost
// PubAcks come from its failpoint: the whole batch is published again, one
// intent at a time, with the same IDs.
func (r *run) produceBatches(ctx context.Context, intents []jsinbox.Intent, each func(i int)) error {
	fp := failpoint.New()
	if r.o.LosePubAck > 0 {
		fp.EnableEvery(failpoint.LosePubAck, max(2, int(1/r.o.LosePubAck)), -1)
	}
	p, err := jsinbox.NewPublisher(r.js, jsinbox.PublisherConfig{Batch: 50, Linger: 5 * time.Millisecond, AckTimeout: 2 * time.Second,
		Retry: jitter.Policy{Kind: jitter.Full, Base: 5 * time.Millisecond, Cap: 100 * time.Millisecond, MaxAttempts: 20}})
	if err != nil {
		return err
	}
	defer p.Close()
	fp.Attach(p)
	for i, in := range intents {
		each(i)
		if err := p.Publish(ctx, in); err != nil {
			return err
		}
	}
	if err := p.Flush(ctx); err != nil {
		return err
	}
	r.faults["lost PubAcks"].Add(int64(fp.Hits(failpoint.LosePubAck)))
	if f := p.Failures(); len(f) > 0 {
		return fmt.Errorf("%d intents not published, first %s: %w", len(f), f[0].ID, f[0].Err)
	}
	return nil
}

// giveUpUnheard is the planned fault "a crash on the last delivery while
// nobody listens": before any worker runs, a client takes every message in
// the stream (the first intents) through every delivery the durable allows (naking each at once)
// and hangs on the last one with a pull request outstanding. When AckWait
// runs out the server tries that request, gives up on them all and
// announces it once, on core NATS, with nobody subscribed. Workers started
// later must still settle them.
func (r *run) giveUpUnheard(ctx context.Context, nc *nats.Conn, durable string) error {
	c, err := r.js.Consumer(ctx, r.stream, durable)
	if err != nil {
		return err
	}
	// What the producer got into the stream: fewer than it tried when it
	// publishes once and loses some, more when it retries with fresh IDs.
	st, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return err
	}
	n := int(st.CachedInfo().State.Msgs)
	if n == 0 {
		return nil
	}
	maxDeliver := c.CachedInfo().Config.MaxDeliver
	// Take every message again and again, naking it at once, until each
	// was delivered MaxDeliver times; keep it unsettled then.
	last := map[uint64]bool{}
	deadline := time.Now().Add(time.Minute)
	for len(last) < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("give-up fault: %d of %d messages reached their last delivery within a minute", len(last), n)
		}
		b, err := c.Fetch(n, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		for m := range b.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			if md.NumDelivered >= uint64(maxDeliver) {
				last[md.Sequence.Stream] = true
				continue
			}
			_ = m.Nak()
		}
	}
	dead, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		return err
	}
	req := fmt.Sprintf(`{"batch":%d,"expires":%d}`, n, int64(10*time.Second))
	if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+r.stream+"."+durable, dead.Subject, []byte(req)); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	// The request's subscriber stays until the server has given up (it
	// drops a request nobody can receive), taking what comes and settling
	// nothing, as a process that hangs does.
	defer dead.Unsubscribe() //nolint:errcheck // best effort
	// Wait until the server has given up on all of them.
	adv, err := r.js.Stream(ctx, jsinbox.AdvisoryStream(r.stream))
	if err != nil {
		return err
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		info, err := adv.Info(ctx)
		if err == nil && info.State.Msgs >= uint64(n) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("give-up fault: the server gave up on %d of %d messages in time (%v)", info.State.Msgs, n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.faults["unheard give-ups"].Add(int64(n))
	return nil
}

// supervise runs a worker and starts it again when it crashes. Besides the
// random faults, every combination meets the same planned ones: the naive
// strategies lose the acks of the run's second batch and die at their worst
// crash point on its third; jetinbox's worker 0 dies after a COMMIT on its
// third batch and worker 1 before a COMMIT on its second.
func (r *run) supervise(ctx context.Context, strategy, durable string, worker int) {
	for life := 0; ctx.Err() == nil; life++ {
		plan := plan{crashAt: -1, loseAcksAt: -1}
		if life == 0 && worker == 0 {
			plan.crashAt = 3
		}
		if life == 0 && worker == 1 {
			plan.loseAcksAt = 2
		}
		var err error
		switch strategy {
		case "jetinbox":
			err = r.runJetinbox(ctx, durable, plan)
		default:
			err = r.runNaive(ctx, strategy, durable)
		}
		if err != nil && ctx.Err() == nil && !errors.Is(err, errCrashed) && !failpoint.IsCrash(err) {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

var errCrashed = errors.New("crashed")

// plan holds the planned faults of one worker life: batch numbers, -1 for none.
type plan struct{ crashAt, loseAcksAt int }

// runNaive is a consumer without an inbox: ack-first acks a batch and then
// applies it; effect-then-ack applies it in one transaction, then acks.
func (r *run) runNaive(ctx context.Context, strategy, durable string) error {
	c, err := r.js.Consumer(ctx, r.stream, durable)
	if err != nil {
		return err
	}
	ledger := effects.NewLedger()
	for ctx.Err() == nil {
		batch, err := c.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			return err
		}
		var msgs []jetstream.Msg
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if len(msgs) == 0 {
			continue
		}
		// The planned faults go to the run's 2nd and 3rd batches, whichever
		// worker takes them, so that a worker restarted early (a NATS
		// restart, a fetch error) cannot skip them.
		seq := r.batches.Add(1)
		crash := seq == 3 || r.roll(r.o.Crash)
		loseAcks := seq == 2
		if crash && strategy == "ack-first" {
			r.fault("crashes")
			r.ackAll(msgs, loseAcks) // acked, then died before the effect
			return errCrashed
		}
		if crash && strategy == "effect-then-ack" && seq != 3 && r.roll(0.5) {
			r.fault("crashes")
			return errCrashed // died after fetch, before the effect
		}
		if strategy == "ack-first" {
			r.ackAll(msgs, loseAcks)
		}
		im := make([]inbox.Message, len(msgs))
		for i, m := range msgs {
			im[i] = jsinbox.MessageOf(m)
		}
		tx, err := r.pool.Begin(ctx)
		if err != nil {
			continue // no ack: redelivered (unless acked first: lost)
		}
		errs := make([]error, len(im))
		if err := ledger.Handle(ctx, tx, im, errs); err != nil {
			_ = tx.Rollback(ctx)
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			continue
		}
		if strategy == "effect-then-ack" {
			if crash {
				r.fault("crashes")
				return errCrashed // committed, died before the ack
			}
			r.ackAll(msgs, loseAcks)
		}
	}
	return nil
}

func (r *run) ackAll(msgs []jetstream.Msg, lose bool) {
	if lose || r.roll(r.o.LoseAck) {
		r.fault("lost acks")
		return
	}
	for _, m := range msgs {
		_ = m.Ack()
	}
}

// runJetinbox runs the real consumer with its crash points armed by the
// dice: one failpoint set per worker life.
func (r *run) runJetinbox(ctx context.Context, durable string, pl plan) error {
	fp := failpoint.New()
	switch {
	case pl.crashAt > 0:
		fp.EnableEvery(failpoint.AfterCommit, pl.crashAt, 1)
	case pl.loseAcksAt > 0:
		fp.EnableEvery(failpoint.BeforeCommit, pl.loseAcksAt, 1)
	case r.roll(r.o.Crash * 3):
		points := []hook.Point{failpoint.BeforeClaim, failpoint.BeforeCommit, failpoint.AfterCommit}
		r.diceMu.Lock()
		p := points[r.dice.IntN(len(points))]
		n := 1 + r.dice.IntN(10)
		r.diceMu.Unlock()
		fp.EnableEvery(p, n, 1)
	}
	if pl.loseAcksAt > 0 {
		fp.EnableEvery(failpoint.SkipAck, pl.loseAcksAt, 1)
	} else if r.o.LoseAck > 0 {
		fp.EnableEvery(failpoint.SkipAck, max(1, int(1/r.o.LoseAck)), -1)
	}
	// The scope is the effect's identity, the durable only the
	// subscription: NewLedger writes under the default scope.
	proc, err := inbox.NewProcessor(r.pool, inbox.Config{Scope: effects.DefaultScope, Handler: effects.NewLedger()})
	if err != nil {
		return err
	}
	c, err := jsinbox.NewConsumer(r.js, proc, jsinbox.ConsumerConfig{Durable: durable, BatchSize: 100, DB: r.pool,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	fp.Attach(proc, c)
	err = c.Run(ctx)
	if n := fp.Hits(failpoint.SkipAck); n > 0 {
		r.faults["lost acks"].Add(int64(n))
	}
	if failpoint.IsCrash(err) {
		r.fault("crashes")
	}
	return err
}

// count reads the ledger per intent: an intent whose ID (or a fresh-id
// retry of it) has no entry is dead-lettered if the dead-letter stream has
// it and lost otherwise, one entry is applied once, more is duplicated.
func (r *run) count(ctx context.Context, row *Row) error {
	dead, err := verify.ReadStream(ctx, r.js, jsinbox.DeadLetterStream(r.stream))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	deadIDs := map[string]bool{}
	for _, d := range dead {
		base, _, _ := strings.Cut(d.Header[jsinbox.HeaderMessageID], "~r")
		deadIDs[base] = true
	}
	rows, err := r.pool.Query(ctx, `SELECT message_id, count(*) FROM ledger_entries GROUP BY message_id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	per := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return err
		}
		base, _, _ := strings.Cut(id, "~r")
		per[base] += n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, in := range r.intents {
		switch n := per[in.ID]; {
		case n == 0 && deadIDs[in.ID]:
			row.DeadLettered++
		case n == 0:
			row.Lost++
		case n == 1:
			row.AppliedOnce++
		default:
			row.Duplicated++
		}
	}
	return nil
}
