package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/console"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestConsoleSQLite: the pages read a SQLite store as they read
// PostgreSQL: the overview, an applied and a dead-lettered intent's
// verdicts, the dead letters and a clean verify.
func TestConsoleSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	dbURL := "sqlite://" + filepath.Join(t.TempDir(), "inbox.db")
	store, err := cli.OpenStore(ctx, dbURL, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if _, _, err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.SeedAccounts(ctx, 10); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{DuplicateWindow: window}); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string { return map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL}[k] }
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cli.Consumer(cctx, []string{"-http", ""}, env, io.Discard, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	for _, in := range []inbox.Intent{
		{ID: "ok-1", Subject: "intents.1", Payload: []byte(`{"account":1,"amount":5}`)},
		{ID: "to-999", Subject: "intents.1", Payload: []byte(`{"account":999,"amount":42}`)},
	} {
		if _, err := pub.Publish(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	settle(t, js)
	h, err := console.New(console.Config{JS: js, ReadSQLite: store.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	// No operator credential, no re-drive role: read-only.
	res, err := http.PostForm(hs.URL+"/dlq/redrive", map[string][]string{"seq": {"1"}, "confirm": {"yes"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("re-drive on a read-only console: %d, want 403", res.StatusCode)
	}
	for path, want := range map[string]string{
		"/":                 "applied</th><td>1<",
		"/intent?id=ok-1":   "applied once at",
		"/intent?id=to-999": "dead-lettered: rejected after",
		"/dlq":              "unknown account 999",
		"/verify?run=1":     "clean: every message applied once or dead-lettered",
	} {
		res, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("%s: %d, want %q in:\n%s", path, res.StatusCode, want, b)
		}
	}
}
