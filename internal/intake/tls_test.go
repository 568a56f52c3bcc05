package intake_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/intake"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/jitter"
)

// TestIntakeTLS: with -tls-cert and -tls-key the intake serves TLS only.
func TestIntakeTLS(t *testing.T) {
	dir := t.TempDir()
	dbURL := "sqlite://" + filepath.Join(dir, "intake.db")
	tf := filepath.Join(dir, "tenants.json")
	b, _ := json.Marshal(intake.TenantsFile{Tenants: tenants})
	os.WriteFile(tf, b, 0o600)
	ca := testenv.NewTestCA(t, "intake CA")
	certFile, keyFile := ca.Server("intake")
	roots := ca.Pool
	env := cli.Env(func(string) string { return "" })
	ctx := context.Background()
	if err := intake.Main(ctx, []string{"-database-url", dbURL, "-migrate"}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- intake.Main(cctx, []string{"-database-url", dbURL, "-tenants", tf, "-listen", addr, "-http", "", "-drain-delay", "0s",
			"-tls-cert", certFile, "-tls-key", keyFile, "-log-format", "text"}, env, nil, io.Discard, io.Discard)
	}()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer hc.CloseIdleConnections()
	for i := 0; ; i++ {
		resp, err := hc.Get("https://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if i > 200 {
			t.Fatalf("no TLS intake: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := &idempotency.Client{HTTP: hc, Policy: jitter.Policy{Base: time.Millisecond, MaxAttempts: 1}}
	res, err := c.Do(ctx, idempotency.Request{URL: "https://" + addr + intake.Route, Key: "tls-1", Body: []byte(`{"subject":"intents.x"}`),
		Header: http.Header{"Authorization": {"Bearer acme-token"}}})
	if err != nil || res.Status != http.StatusAccepted {
		t.Fatalf("post over TLS: %+v %v", res, err)
	}
	// Plain HTTP to the TLS port gets no intake answer.
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.Contains(string(body), "ok") {
			t.Fatal("the TLS intake answered plain HTTP")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
