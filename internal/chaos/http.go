// The first hop under faults: clients POST intents through a lossy proxy
// to `jetinbox intake` processes, the relay publishes them, the ledger
// applies them, and each client strategy is counted at the ledger.

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/intake"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// HTTPClients are the client strategies of the HTTP run, one row each.
var HTTPClients = []string{"never-retry", "retry-no-key", "retry-same-key", "concurrent-same-key"}

// HTTPOptions configure `jetinbox chaos -http`.
type HTTPOptions struct {
	// Intents per client strategy (bursts for concurrent-same-key).
	Intents int
	// DropRequest and DropResponse are the shares of requests the proxy
	// drops before the intake sees them and of answers it drops after the
	// intake handled them.
	DropRequest, DropResponse float64
	// Timeout is how long a client waits for an answer.
	Timeout time.Duration
	// Burst is how many copies of one request concurrent-same-key sends
	// at once.
	Burst int
	// Conflicts is how many keys are reused with another body (each must
	// end 422).
	Conflicts int
	// Kills is how many times an intake process is SIGKILLed mid-request
	// (and started again); Restarts restarts the nats-server and
	// PostgreSQL once each.
	Kills    int
	Restarts bool
	Seed     uint64
	Progress io.Writer
}

// HTTPRow is one client strategy's result, counted per intent at the
// ledger: lost (never applied), applied once, duplicated.
type HTTPRow struct {
	Client      string
	Intents     int
	Lost        int
	AppliedOnce int
	Duplicated  int
	// Gave up: the client said outcome unknown (or, never-retry, got no
	// answer).
	GaveUp int
}

// HTTPResult is a whole run.
type HTTPResult struct {
	Rows []HTTPRow
	// Conflicts reused a key with another body; Refused422 of them were
	// refused with 422 in the end.
	Conflicts, Refused422 int
	Faults                string
	Report                *verify.Report
	Elapsed               time.Duration
}

// Clean reports whether the guaranteed rows lost and duplicated nothing,
// every reused key got 422, verify is clean, and the unsafe rows showed
// what they lose.
func (h *HTTPResult) Clean() bool {
	for _, r := range h.Rows {
		switch r.Client {
		case "retry-same-key", "concurrent-same-key":
			if r.Lost > 0 || r.Duplicated > 0 {
				return false
			}
		case "never-retry":
			if r.Lost == 0 {
				return false
			}
		case "retry-no-key":
			if r.Duplicated == 0 {
				return false
			}
		}
	}
	return h.Refused422 == h.Conflicts && h.Report.Clean()
}

// WriteHTTP prints the table.
func WriteHTTP(w io.Writer, h *HTTPResult) {
	fmt.Fprintf(w, "HTTP intake: clients → lossy proxy → jetinbox intake (key + outbox row in one transaction) → relay → INTENTS → ledger (%.1fs)\n", h.Elapsed.Seconds())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "client\tintents\tlost\tapplied once\tduplicated\tgave up\t")
	for _, r := range h.Rows {
		note := ""
		switch {
		case r.Client == "never-retry" && r.Lost == 0:
			note = "this run lost nothing: no request or answer of it was dropped in time"
		case r.Client == "retry-no-key" && r.Duplicated == 0:
			note = "this run duplicated nothing: no answer of it was dropped after the intake committed"
		case r.Client == "retry-same-key" || r.Client == "concurrent-same-key":
			if r.Lost == 0 && r.Duplicated == 0 {
				note = "ok"
			} else {
				note = "GUARANTEE BROKEN"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Client, r.Intents, r.Lost, r.AppliedOnce, r.Duplicated, r.GaveUp, note)
	}
	tw.Flush()
	fmt.Fprintf(w, "same key, another body: %d of %d refused with 422\n", h.Refused422, h.Conflicts)
	fmt.Fprintf(w, "faults: %s\n\nverify on the stream:\n", h.Faults)
	h.Report.WriteTable(w)
}

// HTTPMain is `jetinbox chaos -http`.
func HTTPMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetinbox chaos -http", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := HTTPOptions{Progress: stderr}
	fs.IntVar(&o.Intents, "intents", 200, "intents per client strategy (bursts for concurrent-same-key)")
	fs.Float64Var(&o.DropRequest, "drop-request", 0.15, "share of requests the proxy drops before the intake sees them")
	fs.Float64Var(&o.DropResponse, "drop-response", 0.15, "share of answers the proxy drops after the intake handled the request")
	fs.DurationVar(&o.Timeout, "timeout", 30*time.Millisecond, "how long a client waits for an answer before it gives up on the attempt")
	fs.IntVar(&o.Burst, "burst", 8, "concurrent copies of one request that concurrent-same-key sends at once")
	fs.IntVar(&o.Conflicts, "conflicts", 20, "keys reused with another body (each must end 422)")
	fs.IntVar(&o.Kills, "kills", 2, "times an intake process is SIGKILLed mid-request and started again")
	fs.BoolVar(&o.Restarts, "restarts", true, "restart the nats-server and PostgreSQL once each mid-run")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed for the fault dice")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage of jetinbox chaos -http: clients POST intents through a proxy that drops requests before the\n"+
			"intake and answers after it, with a short client timeout, to two jetinbox intake processes (one SIGKILLed\n"+
			"mid-request and restarted), the outbox relay and ledger workers crashing, a NATS and a PostgreSQL restart;\n"+
			"one row per client strategy, counted at the ledger, and verify on the stream. Exit 0 only when the same-key\n"+
			"rows lost and duplicated nothing, every reused key got 422, verify is clean and the unsafe rows showed\n"+
			"what they lose.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	var bad []error
	if o.Intents < 1 || o.Burst < 2 || o.Conflicts < 0 || o.Kills < 0 {
		bad = append(bad, errors.New("-intents >= 1, -burst >= 2, -conflicts and -kills >= 0"))
	}
	for name, v := range map[string]float64{"drop-request": o.DropRequest, "drop-response": o.DropResponse} {
		if !(v >= 0 && v < 1) {
			bad = append(bad, fmt.Errorf("-%s %v: want a fraction in [0, 1)", name, v))
		}
	}
	if o.Timeout <= 0 {
		bad = append(bad, errors.New("-timeout: must be positive"))
	}
	if fs.NArg() > 0 {
		bad = append(bad, errors.New("unexpected arguments"))
	}
	if err := errors.Join(bad...); err != nil {
		return cli.UsageError{Err: fmt.Errorf("chaos -http: %w", err)}
	}
	res, err := RunHTTP(ctx, o)
	if err != nil {
		return err
	}
	WriteHTTP(stdout, res)
	if !res.Clean() {
		return errors.New("chaos -http: a same-key row lost or duplicated, a reused key was not refused, verify found violations, or an unsafe row showed nothing")
	}
	return nil
}

// httpRun is one run's state.
type httpRun struct {
	*run
	o        HTTPOptions
	dbURL    string
	tenants  string
	tokens   map[string]string
	addrs    []string
	procsMu  sync.Mutex
	procs    []*exec.Cmd
	upstream atomic.Int64 // round-robin over the intakes
	hc       *http.Client
}

// rowBase spaces the amounts of the rows: intent i of row k moves
// k*rowBase + i + 1, so the ledger tells every logical intent apart
// whatever message ID it came under.
const rowBase = 1_000_000

// RunHTTP runs the HTTP pipeline under faults on its own servers.
func RunHTTP(ctx context.Context, o HTTPOptions) (*HTTPResult, error) {
	start := time.Now()
	r := &httpRun{run: &run{stream: jsinbox.DefaultStream, dice: rand.New(rand.NewPCG(o.Seed, 0x4854)), faults: map[string]*atomic.Int64{},
		o: Options{Crash: 0.05, LoseAck: 0.05, LosePubAck: 0.03}}, o: o, tokens: map[string]string{}}
	for _, f := range httpFaults {
		r.faults[f] = &atomic.Int64{}
	}
	for _, f := range faultNames {
		if r.faults[f] == nil {
			r.faults[f] = &atomic.Int64{}
		}
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
	if r.pg, err = testenv.StartPostgres(ctx, testenv.PostgresOptions{}); err != nil {
		return nil, err
	}
	defer r.pg.Close()
	if r.dbURL, err = r.pg.CreateDatabase(ctx, "chaos_http"); err != nil {
		return nil, err
	}
	if r.pool, err = pgxpool.New(ctx, r.dbURL); err != nil {
		return nil, err
	}
	defer r.pool.Close()
	if err := pipeline.Setup(ctx, r.js, r.pool, jsinbox.StreamConfig{}, 64); err != nil {
		return nil, err
	}
	if _, err := pgoutbox.New(r.pool).Migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := pgidempotency.New(r.pool).Migrate(ctx); err != nil {
		return nil, err
	}
	r.store = &cli.Store{PG: r.pool}
	if _, err := r.js.CreateConsumer(ctx, jsinbox.DefaultStream, jetstream.ConsumerConfig{Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Second, MaxDeliver: 50, MaxAckPending: 2000}); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "jetinbox-chaos-http-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var tf intake.TenantsFile
	for _, c := range append(HTTPClients, "conflicts") {
		tok := idempotency.NewKey()
		r.tokens[c] = tok
		tf.Tenants = append(tf.Tenants, intake.Tenant{Name: c, TokenSHA256: intake.HashToken(tok)})
	}
	b, _ := json.Marshal(tf)
	r.tenants = filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(r.tenants, b, 0o600); err != nil {
		return nil, err
	}
	// Two intakes behind the proxy, sharing only the database, each
	// restarted on its address after a kill (below the ephemeral range:
	// see testenv.FreeLoopbackPorts).
	ports, err := testenv.FreeLoopbackPorts(2)
	if err != nil {
		return nil, err
	}
	for _, p := range ports {
		r.addrs = append(r.addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	}
	defer r.stopIntakes()
	for i := range r.addrs {
		if err := r.startIntake(ctx, i); err != nil {
			return nil, err
		}
	}
	r.hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer r.hc.CloseIdleConnections()
	proxy, addr, err := r.startProxy()
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	url := "http://" + addr + intake.Route

	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	planned := plannedRelayCrashes()
	for w := range 2 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			r.superviseHop(wctx, jsinbox.DefaultStream, "ledger", effects.DefaultScope, "", w)
		}()
		go func() { defer wg.Done(); r.superviseIntentsRelay(wctx, planned) }()
	}

	rows := make([]HTTPRow, len(HTTPClients))
	var done atomic.Int64
	total := int64(len(HTTPClients) * o.Intents)
	var cwg sync.WaitGroup
	for k, c := range HTTPClients {
		rows[k] = HTTPRow{Client: c, Intents: o.Intents}
		cwg.Go(func() { rows[k].GaveUp = r.runClient(ctx, url, k, c, &done) })
	}
	conflicts := 0
	cwg.Go(func() { conflicts = r.runConflicts(ctx, url) })
	// The process and server faults, at points of the run's progress.
	events := []struct {
		at   float64
		what func()
	}{}
	for i := range o.Kills {
		at := 0.2 + 0.5*float64(i)/float64(max(1, o.Kills))
		events = append(events, struct {
			at   float64
			what func()
		}{at, func() { r.killIntake(ctx, i%2) }})
	}
	if o.Restarts {
		events = append(events, struct {
			at   float64
			what func()
		}{0.45, func() { r.fault("NATS restarts"); _ = r.nats.Restart() }},
			struct {
				at   float64
				what func()
			}{0.6, func() {
				r.fault("PostgreSQL restarts")
				_ = r.pg.Stop()
				time.Sleep(300 * time.Millisecond)
				_ = r.pg.Start(ctx)
			}})
	}
	clientsDone := make(chan struct{})
	go func() { cwg.Wait(); close(clientsDone) }()
	next := 0
	tick := time.NewTicker(5 * time.Millisecond)
wait:
	for {
		select {
		case <-clientsDone:
			break wait
		case <-tick.C:
			for next < len(events) && float64(done.Load()) >= events[next].at*float64(total) {
				events[next].what()
				next++
			}
		}
	}
	tick.Stop()
	for ; next < len(events); next++ {
		events[next].what()
	}
	serr := r.settleHTTP(ctx)
	stopWorkers()
	wg.Wait()
	for p, name := range relayCrashNames {
		r.faults[name].Add(int64(planned.Hits(p)))
	}
	if serr != nil {
		return nil, serr
	}
	r.pool.Reset()
	res := &HTTPResult{Conflicts: o.Conflicts, Refused422: conflicts}
	if res.Report, err = verify.RunOn(ctx, r.js, verify.Postgres(r.pool), verify.Options{Scope: effects.DefaultScope, Durable: "ledger", Ledger: true}); err != nil {
		return nil, err
	}
	per, err := r.idCounts(ctx, `SELECT amount::text, count(*) FROM ledger_entries GROUP BY amount`)
	if err != nil {
		return nil, err
	}
	for k := range rows {
		for i := range o.Intents {
			switch n := per[strconv.Itoa(k*rowBase+i+1)]; {
			case n == 0:
				rows[k].Lost++
			case n == 1:
				rows[k].AppliedOnce++
			default:
				rows[k].Duplicated++
			}
		}
	}
	res.Rows = rows
	var fs []string
	for _, f := range httpFaults {
		fs = append(fs, fmt.Sprintf("%d %s", r.faults[f].Load(), f))
	}
	res.Faults = strings.Join(fs, ", ")
	res.Elapsed = time.Since(start)
	return res, nil
}

// httpFaults are the faults the HTTP table counts, in order.
var httpFaults = []string{"dropped requests", "dropped answers", "client timeouts", "intake kills", "NATS restarts", "PostgreSQL restarts",
	"crashes", "lost acks", "relay crashes before publish", "relay crashes in PubAck wait", "relay crashes before mark", "relay lost PubAcks"}

func (r *httpRun) startIntake(ctx context.Context, i int) error {
	cmd, err := subproc.Command(context.WithoutCancel(ctx), subproc.RoleJetinbox, "intake", "-database-url", r.dbURL, "-tenants", r.tenants,
		"-listen", r.addrs[i], "-http", "", "-rate", "0", "-drain-delay", "0s", "-unsafe-key-optional", "-wait", "2s", "-max-conns", "8",
		"-prune-interval", "0s", "-log-format", "json")
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return err
	}
	go cmd.Wait()
	r.procsMu.Lock()
	for len(r.procs) <= i {
		r.procs = append(r.procs, nil)
	}
	r.procs[i] = cmd
	r.procsMu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := r.hcOrDefault().Get("http://" + r.addrs[i] + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("intake %d not ready within 30 s: %v", i, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *httpRun) hcOrDefault() *http.Client {
	if r.hc != nil {
		return r.hc
	}
	return http.DefaultClient
}

// killIntake SIGKILLs intake i, whatever it is doing (requests are in
// flight: the clients run), and starts it again.
func (r *httpRun) killIntake(ctx context.Context, i int) {
	r.procsMu.Lock()
	cmd := r.procs[i]
	r.procsMu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Kill()
	r.fault("intake kills")
	time.Sleep(200 * time.Millisecond)
	if err := r.startIntake(ctx, i); err != nil && r.o.Progress != nil {
		fmt.Fprintf(r.o.Progress, "chaos -http: restart intake %d: %v\n", i, err)
	}
}

func (r *httpRun) stopIntakes() {
	r.procsMu.Lock()
	defer r.procsMu.Unlock()
	for _, c := range r.procs {
		if c != nil && c.Process != nil {
			_ = c.Process.Kill()
		}
	}
}

// startProxy serves the lossy proxy in front of the intakes: it drops a
// share of requests before forwarding them (the connection closes, the
// intake never sees them) and a share of answers after the intake
// handled them.
func (r *httpRun) startProxy() (*http.Server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	drop := func(w http.ResponseWriter) {
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			drop(w)
			return
		}
		if r.roll(r.o.DropRequest) {
			r.fault("dropped requests")
			drop(w)
			return
		}
		up := r.addrs[int(r.upstream.Add(1))%len(r.addrs)]
		// The intake finishes what it started even when the client gave
		// up: the proxy waits for it, then maybe loses the answer.
		out, err := http.NewRequestWithContext(context.WithoutCancel(req.Context()), req.Method, "http://"+up+req.URL.Path, bytes.NewReader(body))
		if err != nil {
			drop(w)
			return
		}
		out.Header = req.Header.Clone()
		resp, err := r.hc.Do(out)
		if err != nil {
			drop(w)
			return
		}
		ans, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || r.roll(r.o.DropResponse) {
			if err == nil {
				r.fault("dropped answers")
			}
			drop(w)
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(ans)
	})}
	go srv.Serve(ln)
	return srv, ln.Addr().String(), nil
}

// body is intent i of row k as the client posts it.
func body(k, i int) []byte {
	acct := int64(1 + i%64)
	p := effects.Intent{Account: acct, Amount: int64(k*rowBase + i + 1)}.AppendJSON(nil)
	return fmt.Appendf(nil, `{"subject":"intents.%d","payload":%s}`, acct%16, p)
}

// runClient sends row k's intents with client strategy c, eight at a
// time, and returns how many it gave up on.
func (r *httpRun) runClient(ctx context.Context, url string, k int, c string, done *atomic.Int64) int {
	var gaveUp atomic.Int64
	work := make(chan int)
	var wg sync.WaitGroup
	hdr := http.Header{"Authorization": {"Bearer " + r.tokens[c]}, "Content-Type": {"application/json"}}
	patient := jitter.Policy{Kind: jitter.Full, Base: 5 * time.Millisecond, Cap: 200 * time.Millisecond, MaxElapsed: 2 * time.Minute}
	for range 8 {
		wg.Go(func() {
			for i := range work {
				switch c {
				case "never-retry":
					if res, err := r.once(ctx, url, hdr, idempotency.NewKey(), body(k, i)); err != nil || res.StatusCode != http.StatusAccepted {
						gaveUp.Add(1)
					}
				case "retry-no-key":
					bo := patient.NewBackOff()
					for {
						res, err := r.once(ctx, url, hdr, "", body(k, i))
						if err == nil && res.StatusCode == http.StatusAccepted {
							break
						}
						d := bo.NextBackOff()
						if d < 0 || ctx.Err() != nil {
							gaveUp.Add(1)
							break
						}
						time.Sleep(d)
					}
				case "retry-same-key":
					cl := &idempotency.Client{HTTP: r.hc, Policy: patient, Timeout: r.o.Timeout}
					key := fmt.Sprintf("%s-%d", c, i)
					if _, err := cl.Do(ctx, idempotency.Request{URL: url, Header: hdr, Body: body(k, i), Key: key}); err != nil {
						gaveUp.Add(1)
					}
				case "concurrent-same-key":
					key := fmt.Sprintf("%s-%d", c, i)
					var bw sync.WaitGroup
					for range r.o.Burst {
						bw.Go(func() {
							cl := &idempotency.Client{HTTP: r.hc, Policy: patient, Timeout: r.o.Timeout}
							if _, err := cl.Do(ctx, idempotency.Request{URL: url, Header: hdr, Body: body(k, i), Key: key}); err != nil {
								gaveUp.Add(1)
							}
						})
					}
					bw.Wait()
				}
				done.Add(1)
			}
		})
	}
	for i := range r.o.Intents {
		work <- i
	}
	close(work)
	wg.Wait()
	return int(gaveUp.Load())
}

// once sends one attempt with the client timeout; an empty key sends
// none.
func (r *httpRun) once(ctx context.Context, url string, hdr http.Header, key string, b []byte) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header = hdr.Clone()
	if key != "" {
		req.Header.Set(idempotency.Header, idempotency.FormatKey(key))
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			r.fault("client timeouts")
		}
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, nil
}

// runConflicts posts each conflict key with one body until it is
// accepted, then with another: the answer must end 422. The intents go to
// account 64 with amounts the rows never use. It returns how many ended
// 422.
func (r *httpRun) runConflicts(ctx context.Context, url string) int {
	hdr := http.Header{"Authorization": {"Bearer " + r.tokens["conflicts"]}, "Content-Type": {"application/json"}}
	cl := &idempotency.Client{HTTP: r.hc, Policy: jitter.Policy{Kind: jitter.Full, Base: 5 * time.Millisecond, Cap: 200 * time.Millisecond, MaxElapsed: 2 * time.Minute}, Timeout: r.o.Timeout}
	refused := 0
	for i := range r.o.Conflicts {
		key := fmt.Sprintf("conflict-%d", i)
		first := body(len(HTTPClients), i)
		if res, err := cl.Do(ctx, idempotency.Request{URL: url, Header: hdr, Body: first, Key: key}); err != nil || res.Status != http.StatusAccepted {
			continue
		}
		other := body(len(HTTPClients), i+rowBase/2)
		if res, err := cl.Do(ctx, idempotency.Request{URL: url, Header: hdr, Body: other, Key: key}); err == nil && res.Status == http.StatusUnprocessableEntity {
			refused++
		}
	}
	return refused
}

// superviseIntentsRelay runs an outbox relay into INTENTS and starts it
// again when it crashes, as superviseRelay does for the two-hop run.
func (r *httpRun) superviseIntentsRelay(ctx context.Context, planned *failpoint.Set) {
	for ctx.Err() == nil {
		fp := failpoint.New()
		fp.EnableEvery(failpoint.LosePubAck, 30, -1)
		rl, err := outbox.NewRelay(pgoutbox.New(r.pool), r.js, outbox.RelayConfig{Stream: jsinbox.DefaultStream, Batch: 50,
			Publisher: jsinbox.PublisherConfig{AckTimeout: 2 * time.Second,
				Retry: jitter.Policy{Kind: jitter.Full, Base: 5 * time.Millisecond, Cap: 100 * time.Millisecond, MaxAttempts: 20}},
			Idle:  jitter.Policy{Kind: jitter.Decorrelated, Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond},
			Retry: jitter.Policy{Kind: jitter.Decorrelated, Base: 20 * time.Millisecond, Cap: 500 * time.Millisecond}})
		if err != nil {
			return
		}
		failpoint.AttachAll(rl, planned, fp)
		err = rl.Run(ctx)
		r.faults["relay lost PubAcks"].Add(int64(fp.Hits(failpoint.LosePubAck)))
		if err != nil && !failpoint.IsCrash(err) && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// settleHTTP waits until the outbox has nothing pending and the ledger's
// durable has settled, both at once.
func (r *httpRun) settleHTTP(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		if pending, err := r.pendingOutbox(ctx); err != nil || pending > 0 {
			if ctx.Err() != nil {
				return fmt.Errorf("chaos -http: %d outbox rows still pending: %w", pending, ctx.Err())
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err := pipeline.WaitSettled(ctx, r.js, jsinbox.DefaultStream, "ledger", nil); err != nil {
			return fmt.Errorf("chaos -http: ledger: %w", err)
		}
		if after, err := r.pendingOutbox(ctx); err == nil && after == 0 {
			return nil
		}
	}
}
