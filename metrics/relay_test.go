package metrics

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

// TestRelayObserverIsAttachedByNewRelay: the relay's counters read the
// relay the metrics observe. Given as the relay's Observer, the metrics are
// attached by outbox.NewRelay: no second step that, left out, would leave
// the counters silently at zero.
func TestRelayObserverIsAttachedByNewRelay(t *testing.T) {
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqliteinbox.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m, err := NewRelay(prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(sqliteoutbox.New(db), js, outbox.RelayConfig{Stream: "NOTIFICATIONS", Observer: m})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if m.r != r {
		t.Fatal("NewRelay did not attach its Observer's counters to the relay")
	}
}
