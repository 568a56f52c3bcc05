package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/metrics"
)

// Deliver is `jetinbox deliver`: the delivery dispatcher, a sibling of the
// relay with its own role and failure modes.
func Deliver(ctx context.Context, args []string, env cli.Env, _ io.Reader, _, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox deliver", "Send the deliveries effects decided in their inbox transactions (pgdelivery.Add, sqlitedelivery.Add) to the endpoints of\n"+
		"-endpoints: each POST carries Idempotency-Key and the Standard Webhooks headers (webhook-id = the key, derived from\n"+
		"scope, message ID and endpoint), every answer is recorded, 2xx is delivered, a permanent 4xx is dead-lettered,\n"+
		"no answer / 5xx / 408 / 409 / 425 / 429 is retried under the same key until the endpoint's key retention has passed.\n"+
		"Any number of dispatchers may run: each leases its own rows. Stops on SIGTERM/SIGINT after its calls in flight.", stderr)
	var (
		dbURL     = cli.DatabaseFlag(fs, env, cli.DatabaseUsage+"; required")
		endpoints = fs.String("endpoints", env.Or("JETINBOX_ENDPOINTS", ""), "the endpoints file: a JSON array of {name, url, secret_files, key_retention, key_max_len, key_charset, concurrency, timeout, ca_file}; required (env JETINBOX_ENDPOINTS)")
		lease     = fs.Duration("lease", 0, "how long a leased row is this dispatcher's alone (0: twice the longest endpoint timeout, at least 30s)")
		httpAddr  = fs.String("http", env.Or("JETINBOX_DELIVER_HTTP_ADDR", "127.0.0.1:9093"), "address for /metrics (jetinbox_delivery_*) and /healthz (env JETINBOX_DELIVER_HTTP_ADDR); loopback only by default; empty disables")
		logFormat = fs.String("log-format", env.Or("JETINBOX_LOG_FORMAT", "auto"), "json, text or auto (text on a terminal)")
	)
	kind := jitter.Decorrelated
	fs.Var(&kind, "jitter", "jitter policy for retries, polls and breaker open times: none, full, equal, decorrelated")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	bad := []error{cli.CheckLogFormat(*logFormat), cli.CheckListenAddr("http", *httpAddr)}
	if *endpoints == "" {
		bad = append(bad, errors.New("-endpoints: required"))
	}
	if *lease < 0 {
		bad = append(bad, errors.New("-lease: negative"))
	}
	if err := errors.Join(bad...); err != nil {
		return cli.UsageError{Err: err}
	}
	eps, err := delivery.LoadEndpoints(*endpoints)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	if err := cli.RequireDatabase(*dbURL); err != nil {
		return err
	}
	log := cli.NewLogger(stderr, *logFormat, slog.LevelInfo)
	store, err := cli.OpenStore(ctx, *dbURL, 4, log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer store.Close()
	st := store.DeliveryStore()
	if err := st.CheckSchema(ctx); err != nil {
		return cli.UsageError{Err: err}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.NewDelivery(reg, st.Backlog)
	if err != nil {
		return err
	}
	m.StartSeries(eps)
	d, err := delivery.NewDispatcher(st, delivery.Config{Endpoints: eps, Lease: *lease, Observer: m, Logger: log,
		Retry: jitter.Policy{Kind: kind}, Idle: jitter.Policy{Kind: kind}, Breaker: delivery.BreakerConfig{Open: jitter.Policy{Kind: kind}}})
	if err != nil {
		return cli.UsageError{Err: err}
	}
	if *httpAddr != "" {
		ln, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			return fmt.Errorf("http: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln) //nolint:errcheck // ends with Close
		defer srv.Close()
	}
	names := make([]string, len(eps))
	for i, e := range eps {
		names[i] = e.Name
	}
	log.Info("deliver: running", "store", store.String(), "endpoints", strings.Join(names, ","), "lease", d.Config().Lease)
	err = d.Run(ctx)
	s := d.Stats()
	log.Info("deliver: stopped", "attempts", s.Attempts, "delivered", s.Delivered, "retried", s.Retried, "dead", s.Dead, "lease_lost", s.LeaseLost)
	return err
}

// deliveryDLQ is `jetinbox dlq -deliveries`: list dead deliveries, -show
// one, -redrive a selection (same key).
func deliveryDLQ(ctx context.Context, args []string, env cli.Env, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox dlq -deliveries", "List dead-lettered deliveries (refused for good, or outcome unknown past the key retention), -show one,\n"+
		"or -redrive a selection after fixing the cause (or reconciling with the receiver): each is sent again with its\n"+
		"same idempotency key. Exit 0 ok, 1 failure, 2 usage error.", stderr)
	dbURL := cli.DatabaseFlag(fs, env, cli.DatabaseUsage)
	endpoint := fs.String("endpoint", "", "only this endpoint's dead deliveries")
	show := fs.Int64("show", 0, "print the dead delivery with this ID: key, answer, reason and payload")
	redrive := fs.Bool("redrive", false, "send the selected dead deliveries again (-all, -id, or -endpoint)")
	all := fs.Bool("all", false, "select every dead delivery (of -endpoint, if given)")
	ids := fs.String("id", "", "select by delivery ID (comma-separated)")
	limit := fs.Int("limit", 100, "most rows listed")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := cli.RequireDatabase(*dbURL); err != nil {
		return err
	}
	var sel []int64
	for _, s := range strings.Split(*ids, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("-id %q: %w", s, err)}
		}
		sel = append(sel, n)
	}
	if *redrive && !*all && len(sel) == 0 && *endpoint == "" {
		return cli.UsageError{Err: errors.New("-redrive needs a selection: -all, -id or -endpoint")}
	}
	store, err := cli.OpenStore(ctx, *dbURL, 2, cli.EnvLogger(stderr, env, slog.LevelInfo))
	if err != nil {
		return err
	}
	defer store.Close()
	st := store.DeliveryStore()
	switch {
	case *redrive:
		n, err := st.Redrive(ctx, *endpoint, sel)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "redriven: %d deliveries, pending again with their keys\n", n)
		return nil
	case *show != 0:
		rows, err := st.List(ctx, delivery.StateDead, *endpoint, 1<<20)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.ID == *show {
				fmt.Fprintf(stdout, "id: %d\nendpoint: %s\nscope: %s\nmessage id: %s\nkey: %s\nattempts: %d\nlast status: %d\nreason: %s\nanswer: %q\npayload: %q\n",
					r.ID, r.Endpoint, r.Scope, r.MessageID, r.Key, r.Attempts, r.LastStatus, r.Reason, r.LastBody, r.Payload)
				return nil
			}
		}
		return fmt.Errorf("dlq -deliveries: no dead delivery %d", *show)
	}
	rows, err := st.List(ctx, delivery.StateDead, *endpoint, *limit)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tENDPOINT\tMESSAGE ID\tATTEMPTS\tSTATUS\tREASON")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\n", r.ID, r.Endpoint, r.MessageID, r.Attempts, r.LastStatus, r.Reason)
	}
	return tw.Flush()
}
