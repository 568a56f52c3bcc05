// verify -watch: the verifier as a long-running process that exports what it
// finds on its own /metrics.

package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetinbox/jetinbox/internal/verify"
)

// watchListening, if set (by tests), is told the address /metrics is served on.
var watchListening func(addr string)

// watchVerify runs verify rounds every interval until ctx is done, serving
// /metrics and /healthz on httpAddr (empty: no HTTP). A failed round is
// logged, counted and retried at the next interval: the process keeps
// running, and JetinboxVerifyStale fires if no round succeeds for long.
func watchVerify(ctx context.Context, js jetstream.JetStream, db verify.DB, o verify.Options, checkpoint, httpAddr string, interval time.Duration, log *slog.Logger) error {
	w, err := verify.NewWatchOn(js, db, o, checkpoint)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := w.Register(reg); err != nil {
		return err
	}
	if httpAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		// Alive, not "the last round succeeded": restarting the process
		// would not bring NATS or PostgreSQL back.
		mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "ok") })
		ln, err := net.Listen("tcp", httpAddr)
		if err != nil {
			return fmt.Errorf("verify: http: %w", err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("verify: http", "err", err)
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Shutdown(sctx) //nolint:errcheck // closing down
			<-done
		}()
		log.Info("verify: serving /metrics and /healthz", "addr", ln.Addr().String())
		if watchListening != nil {
			watchListening(ln.Addr().String())
		}
	}
	cp := w.Checkpoint()
	log.Info("verify: watching", "stream", o.Stream, "scope", o.Scope, "durable", o.Durable, "from_seq", cp.Seq+1, "interval", interval)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r, err := w.Round(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			log.Error("verify: round failed; retrying at the next interval", "err", err)
		case r != nil:
			for _, warn := range r.Warnings {
				log.Warn("verify: " + warn)
			}
			cp := w.Checkpoint()
			lvl := slog.LevelInfo
			if !r.Clean() {
				lvl = slog.LevelError
				for _, e := range r.Examples {
					log.Error("verify: violation", "example", e)
				}
			}
			log.Log(ctx, lvl, "verify: round", "checked", r.StreamMessages, "to_seq", cp.Seq, "violations", r.ViolationCount(), "violations_so_far", cp.Violations)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
