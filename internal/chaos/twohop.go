// The two-hop pipeline: intents → ledger (emitting a notification per
// credit through the outbox) → notifications, applied by a second inbox
// scope, with the relays crashing at each of their points.

package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

// The two-hop pipeline's streams and scopes.
const (
	nextStream  = "NOTIFICATIONS"
	nextSubject = "notifications"
	nextScope   = "notifications"
)

// HopRow is one hop of the two-hop pipeline, counted per intent: for the
// second hop, per follow-up every applied first-hop intent must emit.
type HopRow struct {
	Hop          string
	Intents      int
	Lost         int
	AppliedOnce  int
	Duplicated   int
	Unexpected   int
	DeadLettered int
	Faults       string
}

// TwoHop is the result of a two-hop run: its rows, verify's reports on
// both hops, and the chain check between them.
type TwoHop struct {
	// Store names the store the pipeline ran on.
	Store   string
	Rows    []HopRow
	Reports [2]*verify.Report
	Chain   *verify.ChainReport
	Elapsed time.Duration
}

// Clean reports whether both hops lost, duplicated and added nothing and
// every check is clean.
func (t *TwoHop) Clean() bool {
	for _, r := range t.Rows {
		if r.Lost > 0 || r.Duplicated > 0 || r.Unexpected > 0 {
			return false
		}
	}
	return t.Reports[0].Clean() && t.Reports[1].Clean() && t.Chain.Clean()
}

// WriteTwoHop prints the two-hop rows, the chain check and verify's reports.
func WriteTwoHop(w io.Writer, t *TwoHop) {
	fmt.Fprintf(w, "\ntwo-hop pipeline: intents → ledger → outbox → relay → notifications → second scope, on %s (%.1fs)\n", t.Store, t.Elapsed.Seconds())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "hop\tintents\tlost\tapplied once\tduplicated\tunexpected\tdead-lettered\tfaults")
	for _, r := range t.Rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Hop, r.Intents, r.Lost, r.AppliedOnce, r.Duplicated, r.Unexpected, r.DeadLettered, r.Faults)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nchain check (every applied intent's notification in %s once by ID, applied once by scope %q):\n", nextStream, nextScope)
	t.Chain.WriteTable(w, verify.ChainOptions{Stream: nextStream, Scope: nextScope})
	for i, rep := range t.Reports {
		fmt.Fprintf(w, "\nverify on hop %d:\n", i+1)
		rep.WriteTable(w)
	}
}

// twoHopFaults are the faults the two-hop rows count, in order.
var twoHopFaults = []string{"dropped publishes", "lost PubAcks", "crashes", "lost acks", "restarts", "poison intents",
	"relay crashes before publish", "relay crashes in PubAck wait", "relay crashes before mark", "relay lost PubAcks"}

// RunTwoHop runs the two-hop pipeline under faults, on its own servers,
// with the stable-id producer: two workers per hop, two relays, the relays
// dying between COMMIT and publish, in the PubAck wait and between publish
// and mark (each at least once), random crashes of every kind, a NATS and
// a PostgreSQL restart. With o.Store "sqlite" the inbox, both ledgers and
// the outbox live in a SQLite file of its own (relays lease their batches,
// a short lease so that a relay's death shows), and there is no database
// restart.
func RunTwoHop(ctx context.Context, o Options) (*TwoHop, error) {
	start := time.Now()
	r := &run{o: o, stream: jsinbox.DefaultStream, dice: rand.New(rand.NewPCG(o.Seed, 0x2b0b)), faults: map[string]*atomic.Int64{}}
	for _, f := range append(twoHopFaults, faultNames...) {
		r.faults[f] = &atomic.Int64{}
	}
	var err error
	if r.nats, err = natsenv.StartNATS(natsenv.NATSOptions{}); err != nil {
		return nil, err
	}
	defer r.nats.Close()
	nc, err := nats.Connect(r.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	r.js, _ = jetstream.New(nc)
	if o.Store == "sqlite" {
		dir, err := os.MkdirTemp("", "jetinbox-chaos-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		if r.sqlite, err = sqliteinbox.Open(ctx, filepath.Join(dir, "two-hop.db")); err != nil {
			return nil, err
		}
		defer r.sqlite.Close()
		for _, m := range []func(context.Context, *sql.DB) (int, error){func(ctx context.Context, db *sql.DB) (int, error) { return sqliteinbox.New(db).Migrate(ctx) }, effects.MigrateSQLite, func(ctx context.Context, db *sql.DB) (int, error) { return sqliteoutbox.New(db).Migrate(ctx) }} {
			if _, err := m(ctx, r.sqlite); err != nil {
				return nil, err
			}
		}
		if err := effects.SeedAccountsSQLite(ctx, r.sqlite, 64); err != nil {
			return nil, err
		}
		if _, err := jsinbox.EnsureStream(ctx, r.js, jsinbox.StreamConfig{}); err != nil {
			return nil, err
		}
		r.store = &cli.Store{SQLite: r.sqlite}
	} else {
		pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
		if err != nil {
			return nil, err
		}
		defer pg.Close()
		r.pg = pg
		url, err := pg.CreateDatabase(ctx, "chaos_two_hop")
		if err != nil {
			return nil, err
		}
		if r.pool, err = pginbox.NewPool(ctx, url); err != nil {
			return nil, err
		}
		defer r.pool.Close()
		if err := pipeline.Setup(ctx, r.js, r.pool, jsinbox.StreamConfig{}, 64); err != nil {
			return nil, err
		}
		if _, err := pgoutbox.New(r.pool).Migrate(ctx); err != nil {
			return nil, err
		}
		r.store = &cli.Store{PG: r.pool}
	}
	publish := outbox.PublishAtomic
	if o.RelayPublish != "" {
		if publish, err = outbox.ParsePublishMode(o.RelayPublish); err != nil {
			return nil, err
		}
	}
	// Fast batches need allow_batched on the stream.
	next := jsinbox.StreamConfig{Name: nextStream, Subjects: []string{nextSubject + ".>"}, AllowFastBatches: publish == outbox.PublishFast}
	if _, err := jsinbox.EnsureStream(ctx, r.js, next); err != nil {
		return nil, err
	}
	r.intents = pipeline.Generate(pipeline.Load{Count: o.Intents, Accounts: 64, Prefix: "h", Seed: o.Seed})
	if o.Poison > 0 {
		every := max(1, int(1/o.Poison))
		for i := every / 2; i < len(r.intents); i += every {
			r.intents[i].Payload = []byte(`{"account":1,"amount":`)
			r.fault("poison intents")
		}
	}
	for _, d := range []struct{ stream, durable string }{{jsinbox.DefaultStream, "ledger"}, {nextStream, nextScope}} {
		if _, err := r.js.CreateConsumer(ctx, d.stream, jetstream.ConsumerConfig{Durable: d.durable, AckPolicy: jetstream.AckExplicitPolicy,
			AckWait: time.Second, MaxDeliver: 50, MaxAckPending: 2000}); err != nil {
			return nil, err
		}
	}

	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	planned := plannedRelayCrashes()
	for w := range 2 {
		wg.Add(3)
		go func() {
			defer wg.Done()
			r.superviseHop(wctx, jsinbox.DefaultStream, "ledger", effects.DefaultScope, nextSubject, w)
		}()
		go func() {
			defer wg.Done()
			r.superviseHop(wctx, nextStream, nextScope, nextScope, "", w)
		}()
		go func() {
			defer wg.Done()
			r.superviseRelay(wctx, planned, publish)
		}()
	}
	restartNATS := o.Restarts
	perr := r.produce(ctx, "stable-id", r.intents, func(i int) {
		if restartNATS && i == len(r.intents)/2 {
			restartNATS = false
			r.fault("restarts")
			_ = r.nats.Restart()
		}
	})
	if perr == nil && o.Restarts && r.pg != nil {
		r.fault("restarts")
		_ = r.pg.Stop()
		time.Sleep(500 * time.Millisecond)
		perr = r.pg.Start(ctx)
	}
	if perr == nil {
		perr = r.settleTwoHop(ctx)
	}
	stopWorkers()
	wg.Wait()
	for p, name := range relayCrashNames {
		r.faults[name].Add(int64(planned.Hits(p)))
	}
	if perr != nil {
		return nil, perr
	}
	var db verify.DB
	if r.sqlite != nil {
		db = verify.SQLite(r.sqlite)
	} else {
		r.pool.Reset() // fresh connections after the PostgreSQL restart (see runOne)
		db = verify.Postgres(r.pool)
	}

	res := &TwoHop{}
	if res.Reports[0], err = verify.RunOn(ctx, r.js, db, verify.Options{Scope: effects.DefaultScope, Durable: "ledger", Ledger: true}); err != nil {
		return nil, err
	}
	if res.Reports[1], err = verify.RunOn(ctx, r.js, db, verify.Options{Stream: nextStream, Scope: nextScope, Durable: nextScope, Ledger: true}); err != nil {
		return nil, err
	}
	if res.Chain, err = verify.Chain(ctx, r.js, db, verify.ChainOptions{Stream: nextStream, Scope: nextScope, Ledger: true}); err != nil {
		return nil, err
	}
	var fs []string
	for _, f := range twoHopFaults {
		fs = append(fs, fmt.Sprintf("%d %s", r.faults[f].Load(), f))
	}
	faults := strings.Join(fs, ", ")
	one := Row{}
	if err := r.count(ctx, &one); err != nil {
		return nil, err
	}
	res.Rows = append(res.Rows, HopRow{Hop: "1: intents → ledger", Intents: len(r.intents), Lost: one.Lost, AppliedOnce: one.AppliedOnce,
		Duplicated: one.Duplicated, Unexpected: res.Reports[0].Unexpected, DeadLettered: one.DeadLettered, Faults: faults})
	two, err := r.countNext(ctx)
	if err != nil {
		return nil, err
	}
	two.Unexpected = res.Chain.Unexpected + res.Reports[1].Unexpected
	two.Faults = faults
	res.Rows = append(res.Rows, two)
	res.Elapsed = time.Since(start)
	res.Store = "PostgreSQL"
	if r.sqlite != nil {
		res.Store = "SQLite"
	}
	return res, nil
}

// idCounts runs q, whose rows are an ID and a count, on the run's store.
// q has no parameters, so that it reads the same in both dialects.
func (r *run) idCounts(ctx context.Context, q string) (map[string]int, error) {
	got := map[string]int{}
	each := func(next func() bool, scan func(...any) error) error {
		for next() {
			var id string
			var n int
			if err := scan(&id, &n); err != nil {
				return err
			}
			got[id] += n
		}
		return nil
	}
	if r.sqlite != nil {
		rows, err := r.sqlite.QueryContext(ctx, q)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		if err := each(rows.Next, rows.Scan); err != nil {
			return nil, err
		}
		return got, rows.Err()
	}
	rows, err := r.pool.Query(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if err := each(rows.Next, rows.Scan); err != nil {
		return nil, err
	}
	return got, rows.Err()
}

// pendingOutbox counts the outbox rows not yet published.
func (r *run) pendingOutbox(ctx context.Context) (int, error) {
	const q = `SELECT count(*) FROM outbox WHERE sent_at IS NULL AND failed IS NULL`
	var n int
	if r.sqlite != nil {
		return n, r.sqlite.QueryRowContext(ctx, q).Scan(&n)
	}
	return n, r.pool.QueryRow(ctx, q).Scan(&n)
}

// settleTwoHop waits until the first hop is settled, the outbox has
// nothing pending and the second hop is settled, all at once.
func (r *run) settleTwoHop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		err := pipeline.WaitSettled(ctx, r.js, jsinbox.DefaultStream, "ledger", nil)
		if err != nil {
			return fmt.Errorf("two-hop: hop 1: %w", err)
		}
		if pending, err := r.pendingOutbox(ctx); err != nil || pending > 0 {
			if ctx.Err() != nil {
				return fmt.Errorf("two-hop: %d outbox rows still pending: %w", pending, ctx.Err())
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err := pipeline.WaitSettled(ctx, r.js, nextStream, nextScope, nil); err != nil {
			return fmt.Errorf("two-hop: hop 2: %w", err)
		}
		// Nothing came in meanwhile: both hops settled and the outbox empty.
		if after, err := r.pendingOutbox(ctx); err == nil && after == 0 &&
			pipeline.WaitSettled(ctx, r.js, jsinbox.DefaultStream, "ledger", nil) == nil {
			return nil
		}
	}
}

// countNext counts the second hop per follow-up that the first hop's
// applied intents must have emitted: lost (no entry of the second scope,
// not dead-lettered), applied once, duplicated.
func (r *run) countNext(ctx context.Context) (HopRow, error) {
	row := HopRow{Hop: "2: ledger → outbox → notifications"}
	dead, err := verify.ReadStream(ctx, r.js, jsinbox.DeadLetterStream(nextStream))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return row, err
	}
	deadIDs := map[string]bool{}
	for _, d := range dead {
		deadIDs[d.Header[jsinbox.HeaderMessageID]] = true
	}
	per, err := r.idCounts(ctx, `SELECT message_id, count(*) FROM ledger_entries WHERE scope = '`+nextScope+`' GROUP BY message_id`)
	if err != nil {
		return row, err
	}
	parents, err := r.idCounts(ctx, `SELECT message_id, 1 FROM inbox WHERE scope = '`+effects.DefaultScope+`' AND status = 'applied'`)
	if err != nil {
		return row, err
	}
	for parent := range parents {
		id, err := outbox.FollowUpID(parent, effects.DefaultFollowUpKind)
		if err != nil {
			return row, err
		}
		row.Intents++
		switch n := per[id]; {
		case n == 0 && deadIDs[id]:
			row.DeadLettered++
		case n == 0:
			row.Lost++
		case n == 1:
			row.AppliedOnce++
		default:
			row.Duplicated++
		}
	}
	return row, nil
}

// superviseHop runs a jetinbox worker of one hop and starts it again when
// it crashes: each life arms one random crash point (before the claim,
// before COMMIT, after COMMIT before the ack) with the -crash odds, and
// loses acks at the -lose-ack rate. Worker 0's first life dies after its
// third COMMIT: its effects, follow-ups included, are committed and its
// messages come back. Its ledger emits follow-ups on followUps, if set.
func (r *run) superviseHop(ctx context.Context, stream, durable, scope, followUps string, worker int) {
	for life := 0; ctx.Err() == nil; life++ {
		fp := failpoint.New()
		switch {
		case life == 0 && worker == 0:
			fp.EnableEvery(failpoint.AfterCommit, 3, 1)
		case r.roll(r.o.Crash * 3):
			points := []hook.Point{failpoint.BeforeClaim, failpoint.BeforeCommit, failpoint.AfterCommit}
			r.diceMu.Lock()
			p, n := points[r.dice.IntN(len(points))], 1+r.dice.IntN(10)
			r.diceMu.Unlock()
			fp.EnableEvery(p, n, 1)
		}
		if r.o.LoseAck > 0 {
			fp.EnableEvery(failpoint.SkipAck, max(1, int(1/r.o.LoseAck)), -1)
		}
		err := func() error {
			proc, err := r.store.FollowUpLedgerProcessor(inbox.Config{Scope: scope}, followUps)
			if err != nil {
				return err
			}
			c, err := jsinbox.NewConsumer(r.js, proc, jsinbox.ConsumerConfig{Stream: stream, Durable: durable, BatchSize: 100})
			if err != nil {
				return err
			}
			fp.Attach(proc, c)
			return c.Run(ctx)
		}()
		r.faults["lost acks"].Add(int64(fp.Hits(failpoint.SkipAck)))
		if failpoint.IsCrash(err) {
			r.fault("crashes")
			continue
		}
		if err != nil && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// sqliteLease is how long a relay of the SQLite run holds a batch: longer
// than a round there (PubAcks wait 2 s), short enough that the rows of a
// relay that died go out again soon.
const sqliteLease = 5 * time.Second

// relayCrashNames names the relay's crash points in the fault counts.
var relayCrashNames = map[hook.Point]string{
	failpoint.RelayBeforePublish: "relay crashes before publish",
	failpoint.RelayPubAckWait:    "relay crashes in PubAck wait",
	failpoint.RelayBeforeMark:    "relay crashes before mark",
}

// plannedRelayCrashes arms every relay crash point once, in one set both
// relays share, so that each fires at least once in whichever relay passes
// it first: the first three rounds that have rows, on either relay, die
// between COMMIT and publish, in the PubAck wait and between publish and
// mark. (Plans per relay life could wait for rows that the other relay
// took, and a short run would end without them.)
func plannedRelayCrashes() *failpoint.Set {
	fp := failpoint.New()
	for p := range relayCrashNames {
		fp.Enable(p, 1)
	}
	return fp
}

// superviseRelay runs a relay and starts it again when it crashes. Every
// life takes the planned crashes its relay passes first, dies at a random
// relay crash point within 1/-crash rounds, and loses PubAcks at the
// -lose-puback rate.
func (r *run) superviseRelay(ctx context.Context, planned *failpoint.Set, publish outbox.PublishMode) {
	for ctx.Err() == nil {
		fp := failpoint.New()
		if r.o.Crash > 0 {
			// Each life also dies at a random point within its first
			// 1/Crash rounds: rounds are few, so odds per life would
			// leave most runs with only the planned crashes.
			points := []hook.Point{failpoint.RelayBeforePublish, failpoint.RelayPubAckWait, failpoint.RelayBeforeMark}
			r.diceMu.Lock()
			p, n := points[r.dice.IntN(len(points))], 1+r.dice.IntN(max(1, int(1/r.o.Crash)))
			r.diceMu.Unlock()
			fp.EnableEvery(p, n, 1)
		}
		if r.o.LosePubAck > 0 {
			fp.EnableEvery(failpoint.LosePubAck, max(2, int(1/r.o.LosePubAck)), -1)
		}
		var src outbox.Source = pgoutbox.New(r.pool)
		if r.sqlite != nil {
			src = sqliteoutbox.New(r.sqlite).WithLease(sqliteLease)
		}
		rl, err := outbox.NewRelay(src, r.js, outbox.RelayConfig{Stream: nextStream, Batch: 50, Publish: publish,
			Publisher: jsinbox.PublisherConfig{AckTimeout: 2 * time.Second,
				Retry: jitter.Policy{Kind: jitter.Full, Base: 5 * time.Millisecond, Cap: 100 * time.Millisecond, MaxAttempts: 20}},
			Idle:  jitter.Policy{Kind: jitter.Decorrelated, Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond},
			Retry: jitter.Policy{Kind: jitter.Decorrelated, Base: 20 * time.Millisecond, Cap: 500 * time.Millisecond}})
		if err != nil {
			return
		}
		failpoint.AttachAll(rl, planned, fp)
		err = rl.Run(ctx)
		r.faults["relay lost PubAcks"].Add(int64(fp.Hits(failpoint.LosePubAck)))
		for p, name := range relayCrashNames {
			r.faults[name].Add(int64(fp.Hits(p)))
		}
		if err != nil && !failpoint.IsCrash(err) && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
}
