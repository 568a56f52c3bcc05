package app

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestConsoleMTLS runs `jetinbox console -tls-cert -tls-key -client-ca`:
// a client certificate the CA signed makes its holder an operator (a
// session on the first page, and an action with its CSRF token goes
// through); without one the console is read-only to that client (an
// action is refused 401); a certificate another CA signed ends the
// handshake (one the client holds but the server's CA list does not name
// is not even sent: that client is read-only).
func TestConsoleMTLS(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	dbURL := "sqlite://" + filepath.Join(t.TempDir(), "inbox.db")
	store, err := cli.OpenStore(ctx, dbURL, 2, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	store.Close()

	ca, rogue := testenv.NewTestCA(t, "jetinbox console CA"), testenv.NewTestCA(t, "someone else's CA")
	certFile, keyFile := ca.Server("console")
	var stdout, stderr testenv.SyncBuffer
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Console(cctx, []string{"-s", srv.URL(), "-database-url", dbURL, "-redrive-database-url", dbURL,
			"-listen", "127.0.0.1:0", "-tls-cert", certFile, "-tls-key", keyFile, "-client-ca", ca.File},
			func(string) string { return "" }, nil, &stdout, &stderr)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("console: %v\n%s", err, stderr.String())
		}
	})
	line := regexp.MustCompile(`console on (https://\S+) \(operator actions enabled\)`)
	var base string
	for base == "" {
		if m := line.FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
			break
		}
		select {
		case err := <-done:
			t.Fatalf("console ended: %v\n%s", err, stderr.String())
		case <-ctx.Done():
			t.Fatalf("no console line:\n%s\n%s", stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	client := func(certs ...tls.Certificate) *http.Client {
		jar, _ := cookiejar.New(nil)
		return &http.Client{Jar: jar, Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, Certificates: certs, MinVersion: tls.VersionTLS12}}}
	}
	get := func(c *http.Client) (string, *http.Response) {
		t.Helper()
		resp, err := c.Get(base + "dlq")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /dlq: %d", resp.StatusCode)
		}
		return string(b), resp
	}
	logout := func(c *http.Client, csrf string) int {
		t.Helper()
		resp, err := c.PostForm(base+"logout", url.Values{"csrf": {csrf}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	csrfRe := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

	// The CA's client: an operator without signing in.
	op := client(ca.ClientTLS("operator"))
	page, _ := get(op)
	m := csrfRe.FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, "/logout") {
		t.Fatalf("a client certificate the CA signed got no operator session: %.300s", page)
	}
	if code := logout(op, m[1]); code != http.StatusSeeOther {
		t.Errorf("an action with the operator's session and CSRF token: %d, want 303", code)
	}

	// No client certificate: read-only.
	anon := client()
	page, resp := get(anon)
	if csrfRe.MatchString(page) || len(resp.Cookies()) != 0 {
		t.Errorf("a client without a certificate got an operator session")
	}
	if code := logout(anon, "0123"); code != http.StatusUnauthorized {
		t.Errorf("an action without a certificate: %d, want 401", code)
	}

	if page, _ := get(client(rogue.ClientTLS("bystander"))); csrfRe.MatchString(page) {
		t.Errorf("a client holding only another CA's certificate got an operator session")
	}

	// Another CA's certificate, sent although the server names only its
	// own CA: no connection at all.
	intruder := rogue.ClientTLS("intruder")
	forced := client()
	forced.Transport.(*http.Transport).TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &intruder, nil
	}
	if resp, err := forced.Get(base + "dlq"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Errorf("a certificate another CA signed was accepted: %d, operator %v", resp.StatusCode, csrfRe.Match(b))
	}
}
