package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/console"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// sqliteConsole is a console on an embedded nats-server and a migrated
// SQLite inbox, edited by set before it is built.
func sqliteConsole(t *testing.T, set func(*console.Config, jetstream.JetStream, *cli.Store)) http.Handler {
	t.Helper()
	ctx := context.Background()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	store, err := cli.OpenStore(ctx, "sqlite://"+filepath.Join(t.TempDir(), "inbox.db"), 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if _, _, err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	cfg := console.Config{JS: js, ReadSQLite: store.SQLite}
	if set != nil {
		set(&cfg, js, store)
	}
	h, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestSignInLimit: five wrong tokens from one host are answered 401; the
// sixth try is refused with 429 and a Retry-After before its token is
// compared, so even the right token waits; another host still signs in.
func TestSignInLimit(t *testing.T) {
	t.Parallel()
	const token = "an-operator-token-of-enough-bytes"
	h := sqliteConsole(t, func(c *console.Config, js jetstream.JetStream, st *cli.Store) {
		c.OperatorToken = token
		c.Redrive = &console.Redrive{JS: js, Store: st}
	})
	signIn := func(remote, tok string) *http.Response {
		req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"token": {tok}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Result()
	}
	const guesser, other = "198.51.100.7:40000", "203.0.113.9:40000"
	for i := range 5 {
		if resp := signIn(guesser, "a wrong guess"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong sign-in %d: %d, want 401", i+1, resp.StatusCode)
		}
	}
	resp := signIn(guesser, "another wrong guess")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("sixth wrong sign-in: %d, want 429", resp.StatusCode)
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 13 {
		t.Errorf("Retry-After %q, want 1..13 seconds", resp.Header.Get("Retry-After"))
	}
	if resp := signIn(guesser, token); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("the right token from the blocked host: %d, want 429", resp.StatusCode)
	}
	if resp := signIn(other, token); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("the right token from another host: %d, want 303", resp.StatusCode)
	}
}
