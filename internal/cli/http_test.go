package cli

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestHealthzReportsAConnectionClosedForGood: /healthz is what a supervisor
// restarts on. A NATS outage is not a reason (the client reconnects), but a
// connection nats.go closed for good never comes back: /healthz must turn
// 503 then, for the consumer, the relay and the producer alike.
func TestHealthzReportsAConnectionClosedForGood(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	h := httpHandler(nil, nc, prometheus.NewRegistry())
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(); code != http.StatusOK {
		t.Fatalf("connected: %d %s", code, body)
	}
	nc.Close()
	if code, body := get(); code != http.StatusServiceUnavailable || !strings.Contains(body, "closed for good") {
		t.Fatalf("closed: %d %q, want 503 saying the connection is closed for good", code, body)
	}
}
