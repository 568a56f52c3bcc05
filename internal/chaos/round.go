// One combination of a producer and a consumer strategy: its own servers
// and database, the faults it meets, and the count per intent.

package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
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
)

type run struct {
	o    Options
	pg   *testenv.Postgres
	nats *natsenv.NATS
	js   jetstream.JetStream
	pool *pgxpool.Pool
	// sqlite is the two-hop run's SQLite file, when it runs there (pool
	// is nil then); store is the two-hop run's store either way.
	sqlite  *sql.DB
	store   *cli.Store
	intents []inbox.Intent
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
	if r.nats, err = natsenv.StartNATS(natsenv.NATSOptions{}); err != nil {
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
	if r.pool, err = pginbox.NewPool(ctx, url); err != nil {
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
	// The count and verify read through the run's pool. pgxpool pings only
	// connections idle for over a second, so one that the PostgreSQL restart
	// terminated less than a second after its last use passes for alive and
	// fails the first read (57P01): start the checks on fresh connections.
	r.pool.Reset()

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
	entries, err := r.idCounts(ctx, `SELECT message_id, count(*) FROM ledger_entries GROUP BY message_id`)
	if err != nil {
		return err
	}
	per := map[string]int{}
	for id, n := range entries {
		base, _, _ := strings.Cut(id, "~r")
		per[base] += n
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
