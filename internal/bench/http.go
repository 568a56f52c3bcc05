package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/idempotency/sqliteidempotency"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/intake"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

// HTTPRow is one endpoint's measurement in `bench -http`.
type HTTPRow struct {
	Store, Endpoint string
	Requests        int
	PerSec          float64
	P50, P99        time.Duration
}

// HTTPMain is `jetinbox bench -http`: POSTs through the intake with keys
// against the same endpoint without the key store, in one run, on
// PostgreSQL and SQLite.
func HTTPMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox bench -http", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("requests", 3000, "requests per endpoint and round")
	conc := fs.Int("concurrency", 16, "clients sending at once")
	stores := fs.String("stores", "postgres,sqlite", "stores to run on: postgres, sqlite")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 10 || *conc < 1 || fs.NArg() > 0 {
		return cli.UsageError{Err: errors.New("bench -http: -requests >= 10, -concurrency >= 1, no arguments")}
	}
	var rows []HTTPRow
	for _, s := range strings.Split(*stores, ",") {
		r, err := BenchHTTP(ctx, s, *n, *conc)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
	}
	WriteHTTP(stdout, rows)
	return nil
}

// WriteHTTP prints the rows, each keyed row with its ratio to the
// unkeyed one of its store.
func WriteHTTP(w io.Writer, rows []HTTPRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "store\tendpoint\trequests\treq/s\tp50\tp99\tvs without key")
	base := map[string]HTTPRow{}
	for _, r := range rows {
		if r.Endpoint == "without key store" {
			base[r.Store] = r
		}
	}
	for _, r := range rows {
		ratio := ""
		if b, ok := base[r.Store]; ok && r.Endpoint != b.Endpoint && b.PerSec > 0 {
			ratio = fmt.Sprintf("%.2f× the rate, p50 +%v", r.PerSec/b.PerSec, (r.P50 - b.P50).Round(10*time.Microsecond))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%v\t%v\t%s\n", r.Store, r.Endpoint, r.Requests, r.PerSec, r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), ratio)
	}
	tw.Flush()
}

// BenchHTTP measures one store: the intake (key claimed, answer stored,
// outbox row, one transaction) against the same handler without the key
// store (outbox row in a transaction, a fresh ID each), alternating two
// rounds each so that neither gets the warm or the cold half of the run.
func BenchHTTP(ctx context.Context, store string, n, conc int) ([]HTTPRow, error) {
	tenants := []intake.Tenant{{Name: "bench", TokenSHA256: intake.HashToken("bench-token")}}
	cfg := intake.Config{Tenants: tenants, SubjectPrefix: "intents.", Wait: 5 * time.Second}
	var keyed, plain http.Handler
	switch store {
	case "postgres":
		pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
		if err != nil {
			return nil, err
		}
		defer pg.Close()
		url, err := pg.CreateDatabase(ctx, "bench_http")
		if err != nil {
			return nil, err
		}
		pcfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		pcfg.MaxConns = int32(conc)
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		if _, err := pgidempotency.New(pool).Migrate(ctx); err != nil {
			return nil, err
		}
		if _, err := pgoutbox.New(pool).Migrate(ctx); err != nil {
			return nil, err
		}
		s, err := intake.NewPG(pool, cfg)
		if err != nil {
			return nil, err
		}
		keyed = s
		plain = plainHandler(func(ctx context.Context, in inbox.Intent) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if err := pgoutbox.Add(ctx, tx, in); err != nil {
				return err
			}
			return tx.Commit(ctx)
		})
	case "sqlite":
		dir, err := os.MkdirTemp("", "jetinbox-bench-http-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		db, err := sqliteinbox.Open(ctx, filepath.Join(dir, "intake.db"))
		if err != nil {
			return nil, err
		}
		defer db.Close()
		if _, err := sqliteidempotency.New(db).Migrate(ctx); err != nil {
			return nil, err
		}
		if _, err := sqliteoutbox.New(db).Migrate(ctx); err != nil {
			return nil, err
		}
		s, err := intake.NewSQLite(db, cfg)
		if err != nil {
			return nil, err
		}
		keyed = s
		plain = plainHandler(func(ctx context.Context, in inbox.Intent) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := sqliteoutbox.Add(ctx, tx, in); err != nil {
				return err
			}
			return tx.Commit()
		})
	default:
		return nil, cli.UsageError{Err: fmt.Errorf("bench -http: unknown store %q", store)}
	}
	ks, ps := httptest.NewServer(keyed), httptest.NewServer(plain)
	defer ks.Close()
	defer ps.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	defer hc.CloseIdleConnections()
	lat := map[string][]time.Duration{}
	took := map[string]time.Duration{}
	var seq atomic.Int64
	for round := range 2 {
		for _, e := range []struct {
			name, url string
			key       bool
		}{{"with Idempotency-Key", ks.URL, true}, {"without key store", ps.URL, false}} {
			d, ls, err := fire(ctx, hc, e.url+intake.Route, n, conc, e.key, &seq)
			if err != nil {
				return nil, fmt.Errorf("bench -http %s %s round %d: %w", store, e.name, round+1, err)
			}
			lat[e.name] = append(lat[e.name], ls...)
			took[e.name] += d
		}
	}
	var rows []HTTPRow
	for _, name := range []string{"with Idempotency-Key", "without key store"} {
		ls := lat[name]
		slices.Sort(ls)
		rows = append(rows, HTTPRow{Store: store, Endpoint: name, Requests: len(ls), PerSec: float64(len(ls)) / took[name].Seconds(),
			P50: ls[len(ls)/2], P99: ls[len(ls)*99/100]})
	}
	return rows, nil
}

// plainHandler is the intake's work without the key store: parse, check,
// one outbox row under a fresh ID in a transaction, 202.
func plainHandler(add func(context.Context, inbox.Intent) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer bench-token" {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		raw, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var b intake.Body
		if err := json.Unmarshal(raw, &b); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		in := inbox.Intent{ID: "plain:" + idempotency.NewKey(), Subject: b.Subject, Payload: b.Payload}
		if err := in.Validate(); err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		if err := add(r.Context(), in); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		json.NewEncoder(w).Encode(intake.Accepted{ID: in.ID, Subject: in.Subject, State: "accepted"})
	})
}

func fire(ctx context.Context, hc *http.Client, url string, n, conc int, withKey bool, seq *atomic.Int64) (time.Duration, []time.Duration, error) {
	work := make(chan int, n)
	for i := range n {
		work <- i
	}
	close(work)
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for i := range work {
				body := fmt.Appendf(nil, `{"subject":"intents.%d","payload":{"account":%d,"amount":%d}}`, i%16, 1+i%64, 1+i)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer bench-token")
				if withKey {
					req.Header.Set(idempotency.Header, idempotency.FormatKey(fmt.Sprintf("k-%d", seq.Add(1))))
				}
				t0 := time.Now()
				resp, err := hc.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusAccepted {
						err = fmt.Errorf("answer %d", resp.StatusCode)
					}
				}
				lat[i] = time.Since(t0)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, nil, err
	}
	return time.Since(start), lat, nil
}
