// The relay measured on its own: how fast it drains the outbox publishing
// a round's rows as atomic batches (outbox.PublishAtomic) or as one fast
// batch (outbox.PublishFast) against each row handed to the publisher
// (outbox.PublishEach, the relay before atomic rounds), on a stream that
// fsyncs every write and on one that does not, side by side in one run;
// and emit-to-publish at a steady rate.

package bench

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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// RelayOptions are the flags of `jetinbox bench -relay`.
type RelayOptions struct {
	N, Batch, Rounds, Rate int
	Latency                time.Duration
	// Modes: "one" (each row its own publish and PubAck), "each" (each row
	// through the publisher's group commit, the relay's way before atomic
	// rounds), "atomic" (a round's rows as atomic batches), "atomic-seq"
	// (the same, rounds one after the other) and "fast" (a round's rows as
	// one fast batch).
	Modes []string
	// Syncs: "default" (the server's fsync every 2 minutes) and "always".
	Syncs []string
}

// relayModes maps a mode's name to the relay configuration it changes.
var relayModes = map[string]func(*outbox.RelayConfig){
	"one":        func(c *outbox.RelayConfig) { c.Publish, c.Publisher.Batch = outbox.PublishEach, 1 },
	"each":       func(c *outbox.RelayConfig) { c.Publish = outbox.PublishEach },
	"atomic":     func(c *outbox.RelayConfig) { c.Publish = outbox.PublishAtomic },
	"atomic-seq": func(c *outbox.RelayConfig) { c.Publish, c.Sequential = outbox.PublishAtomic, true },
	"fast":       func(c *outbox.RelayConfig) { c.Publish = outbox.PublishFast },
}

// RelayMain is `jetinbox bench -relay`.
func RelayMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox bench -relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o RelayOptions
	var modes, syncs string
	fs.IntVar(&o.N, "n", 50_000, "outbox rows per drain")
	fs.IntVar(&o.Batch, "batch", 1000, "rows per relay round (transaction)")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds; rates are medians, ratios paired round by round")
	fs.IntVar(&o.Rate, "rate", 1000, "rows/s emitted in the emit-to-publish phase")
	fs.DurationVar(&o.Latency, "latency", 5*time.Second, "length of each emit-to-publish phase (0 skips them)")
	fs.StringVar(&modes, "modes", "each,atomic", "relay publish modes, the first the baseline: one (a publish and PubAck per row), each (each row through the publisher's group commit: the relay before atomic rounds), atomic (a round's rows as atomic batches, a round's marks overlapping the next round: the default), atomic-seq (atomic, rounds one after the other), fast (a round's rows as one JetStream fast batch, marks overlapping the next round)")
	fs.StringVar(&syncs, "sync", "default,always", "JetStream sync settings to run: default (fsync every 2 minutes), always (fsync every write, as deploy/ runs NATS)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox bench -relay: the outbox relay draining rows into a stream on embedded NATS and a throwaway PostgreSQL (fsync on),\n"+
			"its publish modes side by side in the same run, with and without sync_interval: always, and emit-to-publish at a steady rate.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Modes, o.Syncs = strings.Split(modes, ","), strings.Split(syncs, ",")
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if o.N < 1 || o.Batch < 1 || o.Rounds < 1 || o.Rate < 1 || o.Latency < 0 {
		errs = append(errs, errors.New("-n, -batch, -rounds and -rate must be positive, -latency not negative"))
	}
	for _, m := range o.Modes {
		if relayModes[m] == nil {
			errs = append(errs, fmt.Errorf("-modes: %q: want one, each, atomic, atomic-seq or fast", m))
		}
	}
	for _, s := range o.Syncs {
		if s != "default" && s != "always" {
			errs = append(errs, fmt.Errorf("-sync: %q: want default or always", s))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cli.UsageError{Err: fmt.Errorf("bench -relay: %w", err)}
	}
	return RunRelay(ctx, o, stdout, stderr)
}

// relayRow is what one mode on one sync setting measured.
type relayRow struct {
	rates    []float64
	lags     []time.Duration
	achieved float64
	batches  int64
	short    int64
}

// RunRelay runs the relay comparison.
func RunRelay(ctx context.Context, o RelayOptions, stdout, stderr io.Writer) error {
	say := func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Durable: true})
	if err != nil {
		return err
	}
	defer pg.Close()
	rows := map[string]map[string]*relayRow{}
	for _, sync := range o.Syncs {
		rows[sync] = map[string]*relayRow{}
		for _, m := range o.Modes {
			rows[sync][m] = &relayRow{}
		}
		if err := relaySync(ctx, pg, sync, o, rows[sync], say); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "jetinbox bench -relay: %d rows per drain, %d rows per round, %d round(s), medians; PostgreSQL fsync on, embedded nats-server\n\n", o.N, o.Batch, o.Rounds)
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "stream sync\tmode\trows/s\tvs %s\tbatches (atomic + fast)\temit-to-publish at %d rows/s: p50\tp99\tmax\n", o.Modes[0], o.Rate)
	for _, sync := range o.Syncs {
		base := rows[sync][o.Modes[0]]
		for _, m := range o.Modes {
			r := rows[sync][m]
			p50, p99, mx := "-", "-", "-"
			if len(r.lags) > 0 {
				p50, p99, mx = ms(pct(r.lags, 50)), ms(pct(r.lags, 99)), ms(pct(r.lags, 100))
			}
			fmt.Fprintf(w, "%s\t%s\t%.0f\t%s\t%d\t%s\t%s\t%s\n", relaySyncName(sync), m, median(r.rates), ratios(r.rates, base.rates), r.batches, p50, p99, mx)
		}
	}
	return w.Flush()
}

func relaySyncName(s string) string {
	if s == "always" {
		return "always"
	}
	return "default (2 min)"
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// relaySync runs every round of every mode on one nats-server with the
// given sync setting.
func relaySync(ctx context.Context, pg *testenv.Postgres, sync string, o RelayOptions, rows map[string]*relayRow, say func(string, ...any)) error {
	srv, err := natsenv.StartNATS(natsenv.NATSOptions{SyncAlways: sync == "always"})
	if err != nil {
		return err
	}
	defer srv.Close()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// Fast batches need allow_batched on the stream.
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{Name: followStream, Subjects: []string{followSubject + ".>"}, AllowFastBatches: true}); err != nil {
		return err
	}
	db := "relay_" + sync
	store, err := pgDatabases{pg}.create(ctx, db, 1)
	if err != nil {
		return err
	}
	defer store.Close()
	for round := range o.Rounds {
		// Each round starts with another mode, so that none always
		// drains right after the fill or the cleanup of another.
		order := slices.Clone(o.Modes)
		k := round % len(order)
		order = append(order[k:], order[:k]...)
		for _, m := range order {
			prefix := fmt.Sprintf("%s-%d-%s", sync, round, m)
			if err := fillOutbox(ctx, store, prefix, o.N); err != nil {
				return err
			}
			if err := pg.Settle(ctx, 30*time.Second); err != nil {
				return err
			}
			r, err := outbox.NewRelay(store.Outbox(), js, relayCfg(o, m, nil))
			if err != nil {
				return err
			}
			start := time.Now()
			for {
				k, err := r.Drain(ctx)
				if err != nil {
					r.Close()
					return fmt.Errorf("relay %s: %w", m, err)
				}
				if k == 0 {
					break
				}
			}
			el := time.Since(start)
			r.Close()
			s := r.Stats()
			if s.Sent != int64(o.N) || s.Duplicates != 0 || s.Failed != 0 {
				return fmt.Errorf("relay %s sent %d rows (%d duplicates, %d failed), want %d", m, s.Sent, s.Duplicates, s.Failed, o.N)
			}
			rows[m].rates = append(rows[m].rates, float64(o.N)/el.Seconds())
			rows[m].batches += s.Batches + s.FastBatches
			rows[m].short += s.FastShort
			say("sync %s round %d %s: %.0f rows/s (%d atomic batches, %d fast batches acknowledged whole, %d in part)", sync, round+1, m, float64(o.N)/el.Seconds(), s.Batches, s.FastBatches, s.FastShort)
		}
	}
	if o.Latency <= 0 {
		return nil
	}
	for _, m := range o.Modes {
		lags, achieved, err := relayLatency(ctx, store, js, o, m, sync)
		if err != nil {
			return err
		}
		rows[m].lags, rows[m].achieved = lags, achieved
		say("sync %s %s: emit-to-publish at %d rows/s offered (%.0f achieved): p50 %v p99 %v (%d rows)", sync, m, o.Rate, achieved, pct(lags, 50), pct(lags, 99), len(lags))
	}
	return nil
}

func relayCfg(o RelayOptions, mode string, lags *lagCollector) outbox.RelayConfig {
	cfg := outbox.RelayConfig{Stream: followStream, Batch: o.Batch, Publisher: jsinbox.PublisherConfig{MaxInFlight: 8192}}
	relayModes[mode](&cfg)
	if lags != nil {
		cfg.Observer = outbox.SentFunc(lags.add)
	}
	return cfg
}

// fillOutbox commits n rows in transactions of 1,000.
func fillOutbox(ctx context.Context, store *cli.Store, prefix string, n int) error {
	payload := []byte(`{"account":17,"amount":250,"note":"a follow-up of about the size the ledger emits"}`)
	ins := make([]inbox.Intent, 0, 1000)
	for i := 0; i < n; i += 1000 {
		ins = ins[:0]
		for j := i; j < min(n, i+1000); j++ {
			ins = append(ins, inbox.Intent{ID: fmt.Sprintf("%s-%d", prefix, j), Subject: fmt.Sprintf("%s.%d", followSubject, j%16), Payload: payload})
		}
		tx, err := store.PG.Begin(ctx)
		if err != nil {
			return err
		}
		if err := pgoutbox.Add(ctx, tx, ins...); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// relayLatency runs a relay (LISTEN, as deployed) while rows are emitted at
// o.Rate, in a transaction every 10 ms, and returns how long each waited
// from its transaction's start until it was marked sent.
func relayLatency(ctx context.Context, store *cli.Store, js jetstream.JetStream, o RelayOptions, mode, sync string) ([]time.Duration, float64, error) {
	lags := &lagCollector{}
	r, err := outbox.NewRelay(store.Outbox(), js, relayCfg(o, mode, lags))
	if err != nil {
		return nil, 0, err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { stop(); <-done }()
	const tick = 10 * time.Millisecond
	payload := []byte(`{"account":17,"amount":250}`)
	start, emitted := time.Now(), 0
	t := time.NewTicker(tick)
	defer t.Stop()
	for time.Since(start) < o.Latency {
		<-t.C
		want := int(time.Since(start).Seconds() * float64(o.Rate))
		if want <= emitted {
			continue
		}
		ins := make([]inbox.Intent, 0, want-emitted)
		for ; emitted < want; emitted++ {
			ins = append(ins, inbox.Intent{ID: fmt.Sprintf("lat-%s-%s-%d", sync, mode, emitted), Subject: followSubject + ".lat", Payload: payload})
		}
		if err := pgoutbox.Add(ctx, store.PG, ins...); err != nil {
			return nil, 0, err
		}
	}
	achieved := float64(emitted) / time.Since(start).Seconds()
	deadline := time.Now().Add(2 * time.Minute)
	for r.Stats().Sent < int64(emitted) {
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("relay %s: %d of %d rows sent after two minutes", mode, r.Stats().Sent, emitted)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return lags.all(), achieved, nil
}
