package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// dedupeReceiver is a receiver that keeps its answers by webhook-id, as
// docs/receivers.md tells one to: a repeat of an applied key is answered
// from the store, never applied again. Its first answer to a key in
// flaky is 503 after applying (the caller cannot know it applied), and
// every request for refuse's key is refused with 422 until fixed.
type dedupeReceiver struct {
	mu      sync.Mutex
	applied map[string]int // key → times the effect ran
	calls   map[string]int // key → requests
	flaky   map[string]bool
	refuse  string
	fixed   atomic.Bool
}

func (rc *dedupeReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(delivery.HeaderID)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.calls[key]++
	if key == rc.refuse && !rc.fixed.Load() {
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprint(w, `{"error":"account closed"}`)
		return
	}
	if rc.applied[key] == 0 {
		rc.applied[key]++
		if rc.flaky[key] {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
	fmt.Fprint(w, `{"ok":true}`)
}

func (rc *dedupeReceiver) snapshot() (applied, calls map[string]int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	applied, calls = map[string]int{}, map[string]int{}
	for k, v := range rc.applied {
		applied[k] = v
	}
	for k, v := range rc.calls {
		calls[k] = v
	}
	return applied, calls
}

// TestDeliveriesOnSQLite: the consumer routes applied messages to an
// endpoint on a SQLite file (a delivery row in the inbox transaction),
// `jetinbox deliver` on the same file sends each under its key while the
// consumer writes, retries a 503 under the same key, dead-letters a 422,
// and `jetinbox dlq -deliveries` lists, shows and redrives it: every
// applied message reaches the receiver, whose effect ran once per key.
func TestDeliveriesOnSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	dir := t.TempDir()
	path := filepath.Join(dir, "inbox.db")
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": "sqlite://" + path})

	// Before the schema: deliver and dlq -deliveries refuse with exit 2.
	rc := &dedupeReceiver{applied: map[string]int{}, calls: map[string]int{},
		flaky:  map[string]bool{delivery.Key("ledger", "dl-1", "billing"): true, delivery.Key("ledger", "dl-2", "billing"): true},
		refuse: delivery.Key("ledger", "dl-3", "billing")}
	hs := httptest.NewServer(rc)
	t.Cleanup(hs.Close)
	endpoints := filepath.Join(dir, "endpoints.json")
	routes := filepath.Join(dir, "routes.json")
	if err := os.WriteFile(endpoints, fmt.Appendf(nil, `[{"name": "billing", "url": %q, "timeout": "5s", "key_retention": "1h"}]`, hs.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(routes, []byte(`{"intents.>": ["billing"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Deliver(ctx, []string{"-endpoints", endpoints, "-http", ""}, env, nil, io.Discard, io.Discard); cli.ExitCode(err) != 2 {
		t.Fatalf("deliver before migrate: %v (exit %d), want 2", err, cli.ExitCode(err))
	}

	var out bytes.Buffer
	if err := Migrate(ctx, nil, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "1 delivery migrations") {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	js := openAccountsAndStream(t, env, srv.URL())
	const n = 60
	if err := cli.Producer(ctx, []string{"-count", fmt.Sprint(n), "-prefix", "dl"}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}

	// The dispatcher runs beside the consumer on the same file.
	dctx, dcancel := context.WithCancel(ctx)
	ddone := make(chan error, 1)
	go func() {
		ddone <- Deliver(dctx, []string{"-endpoints", endpoints, "-http", ""}, env, nil, io.Discard, io.Discard)
	}()
	t.Cleanup(func() {
		dcancel()
		select {
		case <-ddone:
		case <-time.After(2 * time.Minute):
			t.Error("deliver did not stop")
		}
	})
	cctx, ccancel := context.WithCancel(ctx)
	cdone := make(chan error, 1)
	go func() {
		cdone <- cli.Consumer(cctx, []string{"-http", "", "-deliveries", routes}, env, io.Discard, io.Discard)
	}()
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	err := pipeline.WaitSettled(wctx, js, jsinbox.DefaultStream, "ledger", nil)
	wcancel()
	ccancel()
	if cerr := <-cdone; cerr != nil {
		t.Fatalf("consumer -deliveries on SQLite: %v", cerr)
	}
	if err != nil {
		t.Fatal(err)
	}

	db, err := sqliteinbox.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	want := map[string]string{} // key → message ID, for every applied message
	rows, err := db.Query(`SELECT message_id FROM inbox WHERE scope = 'ledger' AND status = 'applied'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		want[delivery.Key("ledger", id, "billing")] = id
	}
	rows.Close()
	var deliveries int
	if err := db.QueryRow(`SELECT count(*) FROM deliveries`).Scan(&deliveries); err != nil {
		t.Fatal(err)
	}
	if len(want) < n-5 || deliveries != len(want) {
		t.Fatalf("%d applied messages, %d delivery rows: want one row per applied message", len(want), deliveries)
	}
	if want[rc.refuse] == "" || want[delivery.Key("ledger", "dl-1", "billing")] == "" {
		t.Fatalf("dl-1 and dl-3 not applied: %v", want)
	}

	// Everything but the refused key arrives, once each; the 503s were
	// retried under their keys.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		applied, _ := rc.snapshot()
		for k := range applied {
			if want[k] == "" {
				t.Fatalf("the receiver got key %s, which no applied message has: a key that is not (scope, message ID, endpoint)'s", k)
			}
		}
		if len(applied) >= len(want)-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("receiver applied %d keys after 2 minutes, want %d", len(applied), len(want)-1)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var dead string
	for time.Now().Before(deadline) && !strings.Contains(dead, "refused: 422") {
		out.Reset()
		if err := DLQ(ctx, []string{"-deliveries"}, env, nil, &out, io.Discard); err != nil {
			t.Fatalf("dlq -deliveries: %v", err)
		}
		dead = out.String()
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(dead, "dl-3") || !strings.Contains(dead, "422") {
		t.Fatalf("dlq -deliveries on SQLite:\n%s", dead)
	}
	var id int64
	if err := db.QueryRow(`SELECT id FROM deliveries WHERE state = 'dead'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := DLQ(ctx, []string{"-deliveries", "-show", fmt.Sprint(id)}, env, nil, &out, io.Discard); err != nil ||
		!strings.Contains(out.String(), "key: "+rc.refuse) || !strings.Contains(out.String(), `account closed`) {
		t.Fatalf("dlq -deliveries -show: %v\n%s", err, out.String())
	}
	if err := DLQ(ctx, []string{"-deliveries", "-redrive"}, env, nil, io.Discard, io.Discard); cli.ExitCode(err) != 2 {
		t.Fatalf("dlq -deliveries -redrive with no selection: %v (exit %d), want 2", err, cli.ExitCode(err))
	}
	rc.fixed.Store(true)
	out.Reset()
	if err := DLQ(ctx, []string{"-deliveries", "-redrive", "-id", fmt.Sprint(id)}, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "redriven: 1") {
		t.Fatalf("dlq -deliveries -redrive: %v\n%s", err, out.String())
	}
	for {
		var left int
		if err := db.QueryRow(`SELECT count(*) FROM deliveries WHERE state <> 'delivered'`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d deliveries not delivered after 2 minutes", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	applied, calls := rc.snapshot()
	for key, id := range want {
		if applied[key] != 1 {
			t.Errorf("%s (key %s): the receiver's effect ran %d times, want once", id, key, applied[key])
		}
	}
	if len(applied) != len(want) {
		t.Errorf("the receiver applied %d keys, want %d (a key it was never meant to get)", len(applied), len(want))
	}
	for _, id := range []string{"dl-1", "dl-2"} {
		if k := delivery.Key("ledger", id, "billing"); calls[k] < 2 {
			t.Errorf("%s answered 503 once, then sent %d times in all; want a retry under its key", id, calls[k])
		}
	}
}
