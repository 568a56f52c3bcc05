// Package deliverchaos is `jetinbox chaos -deliver`: deliveries from a
// real PostgreSQL to a real HTTP receiver under faults, counted at the
// receiver, beside the rows that are known to be unsafe.
package deliverchaos

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/internal/deliverchaos/storm"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// Options configures a run.
type Options struct {
	// Deliveries per row.
	Deliveries int
	// Dispatchers sharing the rows: processes of their own (this binary
	// again, see [Child]).
	Dispatchers int
	// The receiver's faults, each a chance per request: Drop closes the
	// connection before applying; Late applies and answers after the
	// caller's timeout; Fail500 applies, then answers 500; Crash kills the
	// receiver mid-request (before or after applying, at random) and
	// restarts it.
	Drop, Late, Fail500, Crash float64
	// Kill is the chance, per request, that the receiver applies it and
	// then has the harness SIGKILL the dispatcher process that sent it
	// before answering: the process dies between the call and recording
	// its outcome, and a fresh one starts (the row's lease runs out; a
	// dispatcher sends it again).
	Kill float64
	// RestartPG restarts PostgreSQL once per row, mid-run.
	RestartPG bool
	// Seed seeds the fault dice.
	Seed uint64
	// Progress, if set, hears what the run does.
	Progress io.Writer
}

// Defaults are the command's defaults.
func Defaults() Options {
	return Options{Deliveries: 500, Dispatchers: 3, Drop: 0.05, Late: 0.05, Fail500: 0.05, Crash: 0.02, Kill: 0.05, RestartPG: true, Seed: 1}
}

// Row is one configuration's result, counted at the receiver.
type Row struct {
	Name string
	// Safe rows must be clean; unsafe rows must show harm.
	Safe                             bool
	Deliveries, Lost, AppliedTwice   int
	Requests, Faults, Kills, Pending int
	// PGRestarts counts the PostgreSQL restarts during the row.
	PGRestarts int
}

// Clean reports no loss, no duplicate and nothing left pending.
func (r Row) Clean() bool { return r.Lost == 0 && r.AppliedTwice == 0 && r.Pending == 0 }

// Verdict says whether the row is what it should be.
func (r Row) Verdict() string {
	switch {
	case r.Safe && r.Clean():
		return "ok: once each"
	case r.Safe:
		return "FAIL: not once"
	case r.AppliedTwice > 0 || r.Lost > 0:
		return "ok: shows the harm"
	default:
		return "BLIND: no harm seen"
	}
}

// ErrVerdict makes the command exit 1.
var ErrVerdict = errors.New("chaos -deliver: the shipped row is not clean, or an unsafe row shows no harm")

type rowSpec struct {
	name      string
	safe      bool
	dedupe    bool
	keyPerTry bool
}

var rows = []rowSpec{
	{"jetinbox (receiver dedupes on the key)", true, true, false},
	{"receiver without dedupe", false, false, false},
	{"dispatcher: new key per attempt", false, true, true},
}

// Main is the command.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == childArg {
		return runChild(ctx, args[1:], stderr)
	}
	for i, a := range args {
		if a == "-storm" || a == "--storm" {
			return storm.Main(ctx, slices.Delete(slices.Clone(args), i, i+1), stdout, stderr)
		}
	}
	o := Defaults()
	o.Progress = stderr
	fs := flag.NewFlagSet("jetinbox chaos -deliver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Deliveries, "deliveries", o.Deliveries, "deliveries per row")
	fs.IntVar(&o.Dispatchers, "dispatchers", o.Dispatchers, "dispatchers sharing the rows")
	fs.Float64Var(&o.Drop, "drop", o.Drop, "chance the receiver drops a request (closes the connection, nothing applied)")
	fs.Float64Var(&o.Late, "late", o.Late, "chance the receiver applies and answers after the caller's timeout")
	fs.Float64Var(&o.Fail500, "fail-500", o.Fail500, "chance the receiver applies, then answers 500")
	fs.Float64Var(&o.Crash, "crash", o.Crash, "chance the receiver crashes mid-request (before or after applying) and restarts")
	fs.Float64Var(&o.Kill, "kill", o.Kill, "chance per request that the dispatcher process that sent it is SIGKILLed after the receiver applied it, before the answer")
	fs.BoolVar(&o.RestartPG, "restart-pg", o.RestartPG, "restart PostgreSQL once per row, mid-run")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed for the fault dice")
	fs.Bool("storm", false, "instead: the storm after recovery, the breakers' jitter on and off and a naive retry loop (-storm -h: its flags)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Deliveries < 1 || o.Dispatchers < 1 {
		return fmt.Errorf("-deliveries and -dispatchers must be at least 1")
	}
	res, err := Run(ctx, o)
	if err != nil {
		return err
	}
	Print(stdout, res)
	return Check(res)
}

// Check returns [ErrVerdict] unless every safe row is clean and every
// unsafe row shows harm.
func Check(res []Row) error {
	for _, r := range res {
		if r.Safe != r.Clean() || (!r.Safe && r.AppliedTwice == 0 && r.Lost == 0) {
			return ErrVerdict
		}
	}
	return nil
}

// Print writes the table.
func Print(w io.Writer, res []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tdeliveries\trequests\treceiver faults\tdispatcher kills\tpg restarts\tlost\tapplied twice\tpending\tverdict\t")
	for _, r := range res {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n", r.Name, r.Deliveries, r.Requests, r.Faults, r.Kills, r.PGRestarts, r.Lost, r.AppliedTwice, r.Pending, r.Verdict())
	}
	tw.Flush()
}

// Run runs every row on one PostgreSQL of its own.
func Run(ctx context.Context, o Options) ([]Row, error) {
	// The dispatcher processes start while PostgreSQL does.
	fl := newFleet(ctx, o.Dispatchers)
	defer fl.close()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		return nil, err
	}
	defer pg.Close()
	var out []Row
	for i, spec := range rows {
		r, err := runRow(ctx, o, pg, fl, spec, o.Seed+uint64(i))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", spec.name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func (o Options) progress(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

func runRow(ctx context.Context, o Options, pg *testenv.Postgres, fl *fleet, spec rowSpec, seed uint64) (Row, error) {
	row := Row{Name: spec.name, Safe: spec.safe, Deliveries: o.Deliveries}
	url, err := pg.CreateDatabase(ctx, fmt.Sprintf("deliver_chaos_%d", seed))
	if err != nil {
		return row, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return row, err
	}
	defer pool.Close()
	st := pgdelivery.New(pool)
	if _, err := st.Migrate(ctx); err != nil {
		return row, err
	}
	rc, err := startReceiver(o, spec.dedupe, seed)
	if err != nil {
		return row, err
	}
	defer rc.stop()
	// The effects: one transaction, every delivery decided.
	intents := make([]delivery.Intent, o.Deliveries)
	for i := range intents {
		body, _ := json.Marshal(map[string]any{"delivery": i})
		intents[i] = delivery.Intent{Scope: "chaos", MessageID: fmt.Sprintf("m-%d", i), Endpoint: "receiver", Payload: body}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return row, err
	}
	if err := pgdelivery.Add(ctx, tx, intents...); err != nil {
		tx.Rollback(ctx) //nolint:errcheck
		return row, err
	}
	if err := tx.Commit(ctx); err != nil {
		return row, err
	}
	// The dispatchers: processes of their own, each sending to its own
	// path of the receiver, so that the receiver knows whom to kill.
	args := []string{"-database-url", url}
	if spec.keyPerTry {
		args = append(args, "-key-per-attempt")
	}
	cr := fl.startCrew(ctx, o.Dispatchers, rc.url, args...)
	rc.setKill(cr.kill)
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		return cr.stop()
	}
	defer stop() //nolint:errcheck // the error path's: the first error is returned
	restarted := !o.RestartPG
	deadline := time.Now().Add(5 * time.Minute)
	for {
		n, _, err := st.Backlog(ctx)
		if err != nil {
			o.progress("deliver chaos: %s: backlog: %v", spec.name, err)
		}
		if err == nil && n == 0 {
			break
		}
		if err == nil && !restarted && n < int64(o.Deliveries)/2 {
			restarted = true
			row.PGRestarts++
			o.progress("deliver chaos: %s: restarting PostgreSQL with %d deliveries pending", spec.name, n)
			if err := pg.Stop(); err != nil {
				return row, fmt.Errorf("stop PostgreSQL: %w", err)
			}
			time.Sleep(500 * time.Millisecond) // down for a while: what the fault is
			if err := pg.Start(ctx); err != nil {
				return row, fmt.Errorf("start PostgreSQL: %w", err)
			}
		}
		if err := fl.failed(); err != nil {
			return row, err
		}
		if time.Now().After(deadline) {
			row.Pending = int(n)
			break
		}
		select {
		case <-ctx.Done():
			return row, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := stop(); err != nil {
		return row, err
	}
	applied := rc.appliedCounts()
	for i := range o.Deliveries {
		switch applied[i] {
		case 0:
			row.Lost++
		case 1:
		default:
			row.AppliedTwice++
		}
	}
	row.Requests, row.Faults, row.Kills = int(rc.requests.Load()), int(rc.faults.Load()), int(cr.kills.Load())
	o.progress("deliver chaos: %s: %d requests, %d receiver faults, %d dispatcher processes SIGKILLed (%d put to work)", spec.name, row.Requests, row.Faults, row.Kills, cr.starts.Load())
	return row, nil
}

// receiver is the chaos run's receiver. Its "database" (the keys it
// stored and what it applied) outlives its crashes, as a real receiver's
// database outlives its process.
type receiver struct {
	o      Options
	dedupe bool
	url    string
	addr   string

	mu      sync.Mutex
	dice    *rand.Rand
	applied map[int]int
	keys    map[string]bool
	srv     *http.Server
	down    bool

	// kill SIGKILLs the dispatcher process id and returns once it is
	// dead; false if it was dead already. Under mu.
	kill func(id int) bool

	requests, faults atomic.Int64
	stopped          atomic.Bool
}

func startReceiver(o Options, dedupe bool, seed uint64) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rc := &receiver{o: o, dedupe: dedupe, addr: ln.Addr().String(), dice: rand.New(rand.NewPCG(seed, 7)), applied: map[int]int{}, keys: map[string]bool{}}
	rc.url = "http://" + rc.addr + "/hook"
	rc.serve(ln)
	return rc, nil
}

func (rc *receiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(rc.handle), ReadHeaderTimeout: 5 * time.Second, ErrorLog: nil}
	rc.mu.Lock()
	rc.srv = srv
	rc.down = false
	rc.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with Close
}

// crash closes the server and every connection, and restarts it on the
// same address a moment later.
func (rc *receiver) crash() {
	rc.mu.Lock()
	if rc.down {
		rc.mu.Unlock()
		return
	}
	rc.down = true
	srv := rc.srv
	rc.mu.Unlock()
	go func() {
		srv.Close()
		time.Sleep(200 * time.Millisecond)
		for i := 0; i < 100 && !rc.stopped.Load(); i++ {
			ln, err := net.Listen("tcp", rc.addr)
			if err == nil {
				rc.serve(ln)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
}

func (rc *receiver) setKill(kill func(int) bool) {
	rc.mu.Lock()
	rc.kill = kill
	rc.mu.Unlock()
}

func (rc *receiver) stop() {
	rc.stopped.Store(true)
	rc.mu.Lock()
	srv := rc.srv
	rc.mu.Unlock()
	srv.Close()
}

func (rc *receiver) appliedCounts() map[int]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[int]int, len(rc.applied))
	for k, v := range rc.applied {
		out[k] = v
	}
	return out
}

type fault int

const (
	none fault = iota
	drop
	late
	fail500
	crashBefore
	crashAfter
	killSender
)

func (rc *receiver) roll() fault {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	x := rc.dice.Float64()
	o := rc.o
	switch {
	case x < o.Drop:
		return drop
	case x < o.Drop+o.Late:
		return late
	case x < o.Drop+o.Late+o.Fail500:
		return fail500
	case x < o.Drop+o.Late+o.Fail500+o.Crash:
		if rc.dice.IntN(2) == 0 {
			return crashBefore
		}
		return crashAfter
	case x < o.Drop+o.Late+o.Fail500+o.Crash+o.Kill:
		return killSender
	}
	return none
}

// apply is the receiver's transaction: with dedupe, the key and the
// effect commit together and a stored key answers without applying.
func (rc *receiver) apply(key string, d int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.dedupe {
		if rc.keys[key] {
			return
		}
		rc.keys[key] = true
	}
	rc.applied[d]++
}

func (rc *receiver) handle(w http.ResponseWriter, r *http.Request) {
	rc.requests.Add(1)
	var body struct{ Delivery int }
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	key := r.Header.Get(delivery.HeaderID)
	f := rc.roll()
	if f != none && f != killSender {
		rc.faults.Add(1)
	}
	switch f {
	case drop:
		panic(http.ErrAbortHandler) // the connection closes, no answer
	case crashBefore:
		rc.crash()
		panic(http.ErrAbortHandler)
	}
	rc.apply(key, body.Delivery)
	switch f {
	case crashAfter:
		rc.crash()
		panic(http.ErrAbortHandler)
	case killSender:
		// Applied, not answered: the dispatcher that sent it dies before
		// it can hear the answer, let alone record it.
		rc.mu.Lock()
		kill := rc.kill
		rc.mu.Unlock()
		if sender, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/hook/")); err == nil && kill != nil && kill(sender) {
			panic(http.ErrAbortHandler)
		}
	case late:
		select {
		case <-time.After(600 * time.Millisecond): // past the caller's 300 ms
		case <-r.Context().Done():
		}
	case fail500:
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
}
