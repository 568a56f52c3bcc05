package console_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/console"
	"github.com/jetinbox/jetinbox/internal/cli"
)

// TestHostileSizes sends oversized input over a real socket: an ID and a
// key of 1 MiB are refused with 400 (no lookup runs on them), and a form of
// 1 MiB posted to the login and re-drive endpoints is refused, never read
// whole or acted on.
func TestHostileSizes(t *testing.T) {
	t.Parallel()
	h := sqliteConsole(t, func(c *console.Config, _ jetstream.JetStream, _ *cli.Store) {
		c.OperatorToken = "an-operator-token-of-enough-bytes"
	})
	web := httptest.NewServer(h)
	t.Cleanup(web.Close)
	huge := strings.Repeat("x", 1<<20)
	for _, q := range []string{"id=" + huge, "key=" + huge} {
		resp, err := http.Get(web.URL + "/intent?" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /intent?%.8s… of 1 MiB: %d, want 400", q, resp.StatusCode)
		}
	}
	for _, path := range []string{"/login", "/dlq/redrive"} {
		form := url.Values{"token": {huge}, "csrf": {huge}, "seq": {huge}}.Encode()
		req, _ := http.NewRequest(http.MethodPost, web.URL+path, strings.NewReader(form))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", web.URL)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("POST %s with a 1 MiB form: %d, want a refusal", path, resp.StatusCode)
		}
	}
}
