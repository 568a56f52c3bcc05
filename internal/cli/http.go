package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// DefaultHTTPAddr is the consumer's default -http: loopback only, so that a
// consumer started by hand does not offer /metrics to the network. The
// shipped compose and Kubernetes files set their listen address
// explicitly.
const DefaultHTTPAddr = "127.0.0.1:8080"

// serveHTTP serves /metrics, /healthz (the process can still do its work:
// 503 once nc is closed for good), and for a consumer /readyz (consuming
// with NATS and PostgreSQL reachable; 503 while draining).
func serveHTTP(addr string, c *jsinbox.Consumer, nc *nats.Conn, reg *prometheus.Registry, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http: %w", err)
	}
	srv := &http.Server{Handler: httpHandler(c, nc, reg), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http", "err", err)
		}
	}()
	log.Info("http: serving", "addr", ln.Addr().String())
	return srv, nil
}

// httpHandler is what serveHTTP serves.
func httpHandler(c *jsinbox.Consumer, nc *nats.Conn, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Alive: the process serves, and its NATS connection is not closed for
	// good (nats.go never reopens one it closed: only a restart helps).
	// Outages of NATS or the database are not failures here: a round that
	// fails is retried and counted, and /readyz says it, not a restart.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := jsinbox.ClosedForGood(nc); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if c != nil {
		registerHealth(mux, c)
	}
	return mux
}

func registerHealth(mux *http.ServeMux, c *jsinbox.Consumer) {
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		// The rescue backlog is detail, not readiness: a consumer with
		// give-ups to rescue is the one that rescues them.
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		backlog := ""
		if n, err := c.RescueBacklog(ctx); err == nil && n > 0 {
			backlog = fmt.Sprintf("\nrescue backlog: %d max-deliveries advisories not yet settled (jetinbox_rescue_backlog)", n)
		}
		switch {
		case c.Draining():
			http.Error(w, "draining"+backlog, http.StatusServiceUnavailable)
		case !c.Ready():
			http.Error(w, "not ready: not consuming, or NATS or PostgreSQL unreachable"+backlog, http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ready"+backlog)
		}
	})
}
