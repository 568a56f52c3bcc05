package app

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/internal/verify"
)

// TestVerifyWatchServesViolations: verify -watch on a settled pipeline with
// a planted duplicate effect serves, on its own /metrics, the metric and
// label the JetinboxVerifyViolations alert reads
// (jetinbox_verify_violations{kind="duplicated"} 1), the messages checked
// and the time of the last round, and /healthz; it stops cleanly on
// cancel.
func TestVerifyWatchServesViolations(t *testing.T) {
	ctx := context.Background()
	srv, dbURL, pool, js := commandPipeline(t, 200, "vw")
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	consumeSettled(t, env, js)
	if _, err := pool.Exec(ctx, `INSERT INTO ledger_entries (message_id, account, amount) SELECT message_id, account, amount FROM ledger_entries WHERE message_id = 'vw-3'`); err != nil {
		t.Fatal(err)
	}

	addr := make(chan string, 1)
	watchListening = func(a string) { addr <- a }
	t.Cleanup(func() { watchListening = nil })
	vctx, vcancel := context.WithCancel(ctx)
	defer vcancel()
	var logs bytes.Buffer
	vdone := make(chan error, 1)
	go func() {
		vdone <- Verify(vctx, []string{"-watch", "-interval", "100ms", "-http", "127.0.0.1:0", "-checkpoint", t.TempDir() + "/cp.json"}, env, nil, io.Discard, &logs)
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-vdone:
		t.Fatalf("verify -watch: %v\n%s", err, logs.String())
	}
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", path, resp.Status)
		}
		return string(b)
	}
	if h := get("/healthz"); !strings.Contains(h, "ok") {
		t.Fatalf("/healthz: %q", h)
	}
	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^` + verify.MetricViolations + `\{kind="duplicated"\} 1$`),
		regexp.MustCompile(`(?m)^` + verify.MetricViolations + `\{kind="lost"\} 0$`),
		regexp.MustCompile(`(?m)^` + verify.MetricChecked + ` 200$`),
		regexp.MustCompile(`(?m)^` + verify.MetricLastRun + ` [1-9]`),
		regexp.MustCompile(`(?m)^` + verify.MetricCheckpoint + ` 200$`),
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := get("/metrics")
		missing := ""
		for _, re := range want {
			if !re.MatchString(m) {
				missing = re.String()
				break
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %s:\n%s\nlog:\n%s", missing, m, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	vcancel()
	if err := <-vdone; err != nil {
		t.Fatalf("verify -watch after cancel: %v", err)
	}
	if !strings.Contains(logs.String(), `duplicated: \"vw-3\" has 2 ledger entries`) {
		t.Errorf("log does not name the violation:\n%s", logs.String())
	}
}
