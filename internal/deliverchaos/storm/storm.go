// Package storm is `jetinbox chaos -deliver -storm`: deliveries that
// failed together, against a live receiver that comes back, sent by
// dispatchers whose breakers are jittered beside the same code without
// jitter and a naive retry loop.
package storm

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/internal/jittersim"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/jitter"
)

// Options configures the storm after recovery: Rows deliveries to
// one endpoint, Dispatchers dispatchers of Concurrency slots each. Every
// slot's call is in flight when the receiver fails them all at once (so
// every breaker opens at the same instant); the receiver then answers 503
// for Outage and comes back answering 200 after Answer each (a receiver
// that recovers slowly).
type Options struct {
	Rows, Dispatchers, Concurrency int
	Outage, Answer                 time.Duration
	// Naive adds the naive retry loop's row: every delivery retried every
	// 100 ms until it succeeds.
	Naive bool
}

// Defaults are the command's and the test's defaults.
func Defaults() Options {
	return Options{Rows: 1000, Dispatchers: 50, Concurrency: 2, Outage: 800 * time.Millisecond, Answer: 200 * time.Millisecond, Naive: true}
}

// Row is one side: the storm's measure (peak requests in one 10 ms
// bucket) while the receiver was down and from the moment it is back.
type Row struct {
	Name       string
	Down, Back jittersim.Row
	// Together is how many senders (dispatchers; the naive loop's
	// deliveries) came back together: the most whose first request after
	// the receiver was back fell within one ReturnWindow. Senders is how
	// many there were.
	Together, Senders int
}

// ReturnWindow is the window of [Row.Together]: wider than the
// smear a loaded machine puts on requests sent at the same instant
// (leases from PostgreSQL, scheduling), narrower than the breakers'
// jitter.
const ReturnWindow = 200 * time.Millisecond

// The sides of [Run], in its result's order.
const (
	Jittered = iota // the shipped dispatcher
	NoJitter        // the same code, breaker open times and retries without jitter
	Naive           // a naive retry loop (when Options.Naive)
)

// Main is `jetinbox chaos -deliver -storm`.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := Defaults()
	fs := flag.NewFlagSet("jetinbox chaos -deliver -storm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Rows, "deliveries", o.Rows, "deliveries that fail together")
	fs.IntVar(&o.Dispatchers, "dispatchers", o.Dispatchers, "dispatchers (each its own breaker)")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "the endpoint's concurrency per dispatcher")
	fs.DurationVar(&o.Outage, "outage", o.Outage, "how long the receiver answers 503")
	fs.DurationVar(&o.Answer, "answer", o.Answer, "how long each answer takes once the receiver is back")
	fs.BoolVar(&o.Naive, "naive", o.Naive, "add the naive retry loop's row")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Rows < 1 || o.Dispatchers < 1 || o.Concurrency < 1 || o.Outage <= 0 || o.Answer < 0 {
		return errors.New("-deliveries, -dispatchers and -concurrency must be at least 1, -outage positive")
	}
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		return err
	}
	defer pg.Close()
	url, err := pg.CreateDatabase(ctx, "deliver_storm")
	if err != nil {
		return err
	}
	res, err := Run(ctx, url, o)
	if err != nil {
		return err
	}
	Print(stdout, o, res)
	return nil
}

// Print writes the storm's table and the ratio of the back peaks.
func Print(w io.Writer, o Options, res []Row) {
	fmt.Fprintf(w, "%d deliveries in flight or due when the receiver failed them all at once; %d dispatchers × concurrency %d;\n"+
		"down (503) for %v, then back answering in %v; peak = most requests in one 10 ms bucket\n\n", o.Rows, o.Dispatchers, o.Concurrency, o.Outage, o.Answer)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\tdown: peak\tdown: requests\tback: peak\tback: requests\tsenders back within %v\t\n", ReturnWindow)
	for _, r := range res {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d of %d\t\n", r.Name, r.Down.Peak, r.Down.Total, r.Back.Peak, r.Back.Total, r.Together, r.Senders)
	}
	tw.Flush()
	if len(res) > NoJitter && res[Jittered].Back.Peak > 0 {
		fmt.Fprintf(w, "\nback peak without jitter / with: %.1f×\n", float64(res[NoJitter].Back.Peak)/float64(res[Jittered].Back.Peak))
	}
}

// Run runs the sides one after the other on the database at dbURL
// (migrated here), each with a receiver of its own.
func Run(ctx context.Context, dbURL string, o Options) ([]Row, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(o.Dispatchers + 4) // a lease per dispatcher at once, as separate processes would have
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	st := pgdelivery.New(pool)
	if _, err := st.Migrate(ctx); err != nil {
		return nil, err
	}
	var out []Row
	for _, side := range []struct {
		name string
		kind jitter.Kind
	}{{fmt.Sprintf("jetinbox deliver ×%d", o.Dispatchers), jitter.Decorrelated}, {fmt.Sprintf("same, jitter off ×%d", o.Dispatchers), jitter.None}} {
		r, err := stormDispatchers(ctx, pool, st, o, side.name, side.kind)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", side.name, err)
		}
		out = append(out, r)
	}
	if o.Naive {
		r, err := stormNaive(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("naive: %w", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// stormReceiver holds every request until fail, then answers 503 until
// back, then 200 after o.Answer; it keeps the time of every request.
type stormReceiver struct {
	answer time.Duration
	failed chan struct{}
	once   sync.Once

	mu           sync.Mutex
	times        []time.Time
	senders      []string // the path of each request: its sender
	held         int
	down, isBack bool
	backAt       time.Time
}

func (s *stormReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.times = append(s.times, time.Now())
	s.senders = append(s.senders, r.URL.Path)
	held, back := !s.down && !s.isBack, s.isBack
	if held {
		s.held++
	}
	s.mu.Unlock()
	switch {
	case held:
		select {
		case <-s.failed:
		case <-r.Context().Done():
			return
		}
	case back:
		select {
		case <-time.After(s.answer):
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
}

// heldCount returns how many requests are held.
func (s *stormReceiver) heldCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// fail answers every held request 503 at once, and every request after
// it until back.
func (s *stormReceiver) fail() {
	s.mu.Lock()
	s.down = true
	s.mu.Unlock()
	s.once.Do(func() { close(s.failed) })
}

func (s *stormReceiver) back() {
	s.mu.Lock()
	s.isBack, s.backAt = true, time.Now()
	s.mu.Unlock()
}

// measure returns the storm's measure before and from the moment it came
// back.
func (s *stormReceiver) measure(name string) Row {
	s.mu.Lock()
	defer s.mu.Unlock()
	var before, after, firsts []time.Time
	first := map[string]bool{}
	for i, t := range s.times {
		if t.Before(s.backAt) {
			before = append(before, t)
			continue
		}
		after = append(after, t)
		if !first[s.senders[i]] {
			first[s.senders[i]] = true
			firsts = append(firsts, t)
		}
	}
	slices.SortFunc(firsts, time.Time.Compare)
	together := 0
	for i, j := 0, 0; j < len(firsts); j++ {
		for firsts[j].Sub(firsts[i]) >= ReturnWindow {
			i++
		}
		together = max(together, j-i+1)
	}
	return Row{Name: name, Down: jittersim.Measure("down", before, 10*time.Millisecond), Back: jittersim.Measure("back", after, 10*time.Millisecond),
		Together: together, Senders: len(first)}
}

// waitFor polls cond every 10 ms for up to two minutes.
func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("storm: %s: not within two minutes", what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func stormDispatchers(ctx context.Context, pool *pgxpool.Pool, st *pgdelivery.Store, o Options, name string, kind jitter.Kind) (Row, error) {
	rc := &stormReceiver{answer: o.Answer, failed: make(chan struct{})}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	endpoint := "storm-" + kind.String()
	intents := make([]delivery.Intent, o.Rows)
	for i := range intents {
		intents[i] = delivery.Intent{Scope: "storm", MessageID: strconv.Itoa(i), Endpoint: endpoint, Payload: []byte(`{}`)}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return Row{}, err
	}
	if err := pgdelivery.Add(ctx, tx, intents...); err != nil {
		tx.Rollback(ctx) //nolint:errcheck
		return Row{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Row{}, err
	}
	// Long timeouts: the held calls must all be in flight when the
	// receiver fails them, however slowly the dispatchers start.
	ep := delivery.Endpoint{Name: endpoint, Timeout: delivery.Duration(time.Minute), KeyRetention: delivery.Duration(time.Hour), Concurrency: o.Concurrency}
	cfg := delivery.Config{Endpoints: []delivery.Endpoint{ep}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Retry:   jitter.Policy{Kind: kind, Base: 200 * time.Millisecond, Cap: time.Second},
		Idle:    jitter.Policy{Kind: kind, Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond},
		Breaker: delivery.BreakerConfig{Failures: o.Concurrency, Open: jitter.Policy{Kind: kind, Base: time.Second, Cap: 5 * time.Second}}}
	dctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { rc.fail(); cancel(); wg.Wait() }()
	for i := range o.Dispatchers {
		// Each its own path: the receiver tells them apart.
		ep.URL = srv.URL + "/" + strconv.Itoa(i)
		cfg.Endpoints = []delivery.Endpoint{ep}
		d, err := delivery.NewDispatcher(st, cfg)
		if err != nil {
			return Row{}, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = d.Run(dctx) }()
	}
	inFlight := o.Dispatchers * o.Concurrency
	if err := waitFor(ctx, "every slot's call in flight", func() (bool, error) { return rc.heldCount() >= min(inFlight, o.Rows), nil }); err != nil {
		return Row{}, err
	}
	rc.fail()
	if err := sleepCtx(ctx, o.Outage); err != nil { // the outage: what the run is about
		return Row{}, err
	}
	rc.back()
	if err := waitFor(ctx, "every delivery delivered", func() (bool, error) {
		rows, err := st.List(ctx, delivery.StateDelivered, endpoint, o.Rows+1)
		return len(rows) >= o.Rows, err
	}); err != nil {
		return Row{}, err
	}
	return rc.measure(name), nil
}

func stormNaive(ctx context.Context, o Options) (Row, error) {
	rc := &stormReceiver{answer: o.Answer, failed: make(chan struct{})}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Rows}, Timeout: time.Minute}
	defer client.CloseIdleConnections()
	nctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i := range o.Rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for nctx.Err() == nil {
				req, _ := http.NewRequestWithContext(nctx, http.MethodPost, srv.URL+"/"+strconv.Itoa(i), nil)
				req.Header.Set("Idempotency-Key", strconv.Itoa(i))
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						return
					}
				}
				_ = sleepCtx(nctx, 100*time.Millisecond)
			}
		}()
	}
	err := waitFor(ctx, "every naive call in flight", func() (bool, error) { return rc.heldCount() >= o.Rows, nil })
	if err == nil {
		rc.fail()
		err = sleepCtx(ctx, o.Outage)
		rc.back()
	}
	if err != nil {
		cancel()
		wg.Wait()
		return Row{}, err
	}
	wg.Wait()
	if nctx.Err() != nil {
		return Row{}, errors.New("storm: the naive loop did not deliver everything within five minutes")
	}
	return rc.measure("naive retry loop"), nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
