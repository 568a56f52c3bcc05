package deliverchaos

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/pgdelivery"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/jitter"
)

// BenchResult is one side of `jetinbox bench -deliver`.
type BenchResult struct {
	Name      string
	N         int
	Took      time.Duration
	P50, P99  time.Duration
	PerSecond float64
}

// BenchMain is `jetinbox bench -deliver`: deliveries/s and latency to a
// local receiver, jetinbox's dispatcher beside a naive handler that POSTs
// from inside its transaction, same run, same PostgreSQL and receiver.
func BenchMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox bench -deliver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 5000, "deliveries per side")
	workers := fs.Int("workers", 8, "naive side: handlers at once; jetinbox side: the endpoint's concurrency")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 || *workers < 1 {
		return fmt.Errorf("-n and -workers must be at least 1")
	}
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		return err
	}
	defer pg.Close()
	res, err := Bench(ctx, pg, *n, *workers)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%-34s %10s %12s %10s %10s\n", "", "deliveries", "per second", "p50", "p99")
	for _, r := range res {
		fmt.Fprintf(stdout, "%-34s %10d %12.0f %10v %10v\n", r.Name, r.N, r.PerSecond, r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond))
	}
	fmt.Fprintf(stdout, "ratio (jetinbox / naive): %.2f× the throughput\n", res[0].PerSecond/res[1].PerSecond)
	return nil
}

// Bench runs both sides on pg. Latency is from the effect's COMMIT (the
// start of its transaction, for the naive side) to the receiver's answer.
func Bench(ctx context.Context, pg *testenv.Postgres, n, workers int) ([]BenchResult, error) {
	rc := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer rc.Close()
	var out []BenchResult
	for i, name := range []string{"jetinbox (row in the tx, deliver)", "naive (POST inside the tx)"} {
		url, err := pg.CreateDatabase(ctx, fmt.Sprintf("deliver_bench_%d_%d", time.Now().UnixNano(), i))
		if err != nil {
			return nil, err
		}
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return nil, err
		}
		st := pgdelivery.New(pool)
		if _, err := st.Migrate(ctx); err != nil {
			pool.Close()
			return nil, err
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE effects (id text PRIMARY KEY)`); err != nil {
			pool.Close()
			return nil, err
		}
		var r BenchResult
		if i == 0 {
			r, err = benchOurs(ctx, pool, st, n, workers)
		} else {
			r, err = benchNaive(ctx, pool, rc.URL, n, workers)
		}
		pool.Close()
		if err != nil {
			return nil, err
		}
		r.Name = name
		out = append(out, r)
	}
	return out, nil
}

func benchOurs(ctx context.Context, pool *pgxpool.Pool, st *pgdelivery.Store, n, workers int) (BenchResult, error) {
	committed := make([]time.Time, n)
	answered := make([]time.Time, n)
	var mu sync.Mutex
	var done atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b struct{ Delivery int }
		_ = json.NewDecoder(r.Body).Decode(&b)
		mu.Lock()
		if answered[b.Delivery].IsZero() {
			answered[b.Delivery] = time.Now()
			done.Add(1)
		}
		mu.Unlock()
	}))
	defer recv.Close()
	d, err := delivery.NewDispatcher(st, delivery.Config{Endpoints: []delivery.Endpoint{{Name: "bench", URL: recv.URL, Concurrency: workers}},
		Idle: jitter.Policy{Base: time.Millisecond, Cap: 5 * time.Millisecond}, Logger: discardLogger()})
	if err != nil {
		return BenchResult{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = d.Run(rctx) }()
	defer func() { cancel(); wg.Wait() }()
	start := time.Now()
	// The effects commit in parallel, one message a transaction.
	var next atomic.Int64
	var ewg sync.WaitGroup
	errc := make(chan error, workers)
	for range workers {
		ewg.Add(1)
		go func() {
			defer ewg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				id := fmt.Sprintf("m-%d", i)
				tx, err := pool.Begin(ctx)
				if err != nil {
					errc <- err
					return
				}
				body, _ := json.Marshal(map[string]int{"delivery": i})
				_, err = tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, id)
				if err == nil {
					err = pgdelivery.Add(ctx, tx, delivery.Intent{Scope: "bench", MessageID: id, Endpoint: "bench", Payload: body})
				}
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					tx.Rollback(ctx) //nolint:errcheck
					errc <- err
					return
				}
				mu.Lock()
				committed[i] = time.Now()
				mu.Unlock()
			}
		}()
	}
	ewg.Wait()
	select {
	case err := <-errc:
		return BenchResult{}, err
	default:
	}
	for done.Load() < int64(n) {
		if ctx.Err() != nil {
			return BenchResult{}, ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	took := time.Since(start)
	lat := make([]time.Duration, n)
	mu.Lock()
	for i := range n {
		lat[i] = max(answered[i].Sub(committed[i]), 0)
	}
	mu.Unlock()
	return result(n, took, lat), nil
}

func benchNaive(ctx context.Context, pool *pgxpool.Pool, url string, n, workers int) (BenchResult, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t0 := time.Now()
				tx, err := pool.Begin(ctx)
				if err != nil {
					errc <- err
					return
				}
				_, err = tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, fmt.Sprintf("m-%d", i))
				if err == nil {
					var resp *http.Response
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
					if resp, err = client.Do(req); err == nil {
						resp.Body.Close()
					}
				}
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					tx.Rollback(ctx) //nolint:errcheck
					errc <- err
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return BenchResult{}, err
	default:
	}
	return result(n, time.Since(start), lat), nil
}

func result(n int, took time.Duration, lat []time.Duration) BenchResult {
	slices.Sort(lat)
	return BenchResult{N: n, Took: took, P50: lat[len(lat)/2], P99: lat[len(lat)*99/100], PerSecond: float64(n) / took.Seconds()}
}
