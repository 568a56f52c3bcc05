package intake_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/idempotency/sqliteidempotency"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/intake"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

func TestMain(m *testing.M) { testenv.MainNoLeaks(m) }

var tenants = []intake.Tenant{
	{Name: "acme", TokenSHA256: intake.HashToken("acme-token")},
	{Name: "globex", TokenSHA256: intake.HashToken("globex-token"), Rate: 5, Burst: 5, Subjects: "intents.globex."},
}

type world struct {
	srv   *httptest.Server
	relay outbox.Source
	js    jetstream.JetStream
}

func newStream(t *testing.T) jetstream.JetStream {
	ns := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "INTENTS", Subjects: []string{"intents.>"}}); err != nil {
		t.Fatal(err)
	}
	return js
}

func pgWorld(t *testing.T) world {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pgidempotency.New(pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pgoutbox.New(pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := intake.NewPG(pool, intake.Config{Tenants: tenants, SubjectPrefix: "intents.", Wait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return world{srv: srv, relay: pgoutbox.New(pool), js: newStream(t)}
}

func sqliteWorld(t *testing.T) world {
	ctx := context.Background()
	db, err := sqliteinbox.Open(ctx, filepath.Join(t.TempDir(), "intake.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := sqliteidempotency.New(db).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sqliteoutbox.New(db).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := intake.NewSQLite(db, intake.Config{Tenants: tenants, SubjectPrefix: "intents.", Wait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return world{srv: srv, relay: sqliteoutbox.New(db), js: newStream(t)}
}

func post(t *testing.T, w world, token, key, body string) *idempotency.Result {
	t.Helper()
	c := &idempotency.Client{Policy: jitter.Policy{Base: time.Millisecond, Cap: 10 * time.Millisecond, MaxAttempts: 3}}
	res, err := c.Do(context.Background(), idempotency.Request{URL: w.srv.URL + intake.Route, Key: key, Body: []byte(body),
		Header: http.Header{"Authorization": {"Bearer " + token}, "Content-Type": {"application/json"}}})
	if err != nil {
		t.Fatalf("post %s: %v", key, err)
	}
	return res
}

func get(t *testing.T, w world, token, key string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, w.srv.URL+intake.Route+"/"+key, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

func TestIntake(t *testing.T) {
	for name, open := range map[string]func(*testing.T) world{"postgres": pgWorld, "sqlite": sqliteWorld} {
		t.Run(name, func(t *testing.T) { intakeScenario(t, open(t)) })
	}
}

func intakeScenario(t *testing.T, w world) {
	ctx := context.Background()
	body := `{"subject": "intents.credit", "payload": {"account": 7, "cents": 500}}`
	first := post(t, w, "acme-token", "order-1", body)
	var acc intake.Accepted
	if err := json.Unmarshal(first.Body, &acc); err != nil || first.Status != http.StatusAccepted || first.Replayed || acc.ID == "" {
		t.Fatalf("first post: %d %s (%v)", first.Status, first.Body, err)
	}
	again := post(t, w, "acme-token", "order-1", body)
	if !again.Replayed || !bytes.Equal(again.Body, first.Body) || again.Header.Get("Location") != intake.Route+"/order-1" {
		t.Fatalf("retry: %d %s replayed %v, headers %v", again.Status, again.Body, again.Replayed, again.Header)
	}
	if r := post(t, w, "acme-token", "order-1", `{"subject": "intents.credit", "payload": {"account": 7, "cents": 50000}}`); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("another body under the key: %d %s", r.Status, r.Body)
	}
	// The same key from another tenant is another intent.
	other := post(t, w, "globex-token", "order-1", `{"subject": "intents.globex.credit", "payload": {}}`)
	var oacc intake.Accepted
	json.Unmarshal(other.Body, &oacc)
	if other.Status != http.StatusAccepted || other.Replayed || oacc.ID == acc.ID {
		t.Fatalf("globex with acme's key: %d %s", other.Status, other.Body)
	}
	if code, m := get(t, w, "globex-token", "nope"); code != http.StatusNotFound {
		t.Fatalf("GET an unknown key: %d %v", code, m)
	}
	if code, m := get(t, w, "acme-token", "order-1"); code != 200 || m["id"] != acc.ID || m["state"] != "pending" {
		t.Fatalf("GET before the relay ran: %d %v", code, m)
	}
	// Refusals.
	if r := post(t, w, "globex-token", "k2", `{"subject": "intents.acme.credit"}`); r.Status != http.StatusForbidden {
		t.Fatalf("a subject outside the tenant's prefix: %d %s", r.Status, r.Body)
	}
	if r := post(t, w, "wrong", "k3", body); r.Status != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d", r.Status)
	}
	if r := post(t, w, "acme-token", "k4", `{"subject": "intents.>"}`); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("a wildcard subject: %d %s", r.Status, r.Body)
	}
	if r := post(t, w, "acme-token", "k5", `not json`); r.Status != http.StatusBadRequest {
		t.Fatalf("not JSON: %d %s", r.Status, r.Body)
	}
	limited := 0
	for i := range 10 {
		req, _ := http.NewRequest(http.MethodPost, w.srv.URL+intake.Route, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer globex-token")
		req.Header.Set(idempotency.Header, fmt.Sprintf("burst-%d", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			limited++
			if resp.Header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
		}
	}
	if limited == 0 {
		t.Fatal("globex's rate of 5/s let 10 requests at once through")
	}
	// The relay publishes the row with Nats-Msg-Id = the intent's ID.
	relay, err := outbox.NewRelay(w.relay, w.js, outbox.RelayConfig{Stream: "INTENTS", NoListen: true,
		Idle: jitter.Policy{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, m := get(t, w, "acme-token", "order-1"); m["state"] == "published" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay did not publish the intent within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	st, _ := w.js.Stream(ctx, "INTENTS")
	msg, err := st.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if id := msg.Header.Get(nats.MsgIdHdr); id != acc.ID && id != oacc.ID {
		t.Fatalf("stream message 1 has Nats-Msg-Id %q, want %s or %s", id, acc.ID, oacc.ID)
	}
	info, _ := st.Info(ctx)
	if info.State.Msgs != 2 {
		t.Fatalf("%d messages in the stream, want 2 (acme's and globex's)", info.State.Msgs)
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestIntakeCommand runs `jetinbox intake` on a SQLite file: -migrate,
// serve, answer, drain on cancel; usage errors exit 2.
func TestIntakeCommand(t *testing.T) {
	dir := t.TempDir()
	dbURL := "sqlite://" + filepath.Join(dir, "intake.db")
	tf := filepath.Join(dir, "tenants.json")
	b, _ := json.Marshal(intake.TenantsFile{Tenants: tenants})
	os.WriteFile(tf, b, 0o600)
	env := cli.Env(func(string) string { return "" })
	run := func(ctx context.Context, args ...string) (string, error) {
		var out, errb bytes.Buffer
		err := intake.Main(ctx, append([]string{"-database-url", dbURL, "-log-format", "text"}, args...), env, strings.NewReader("acme-token\n"), &out, &errb)
		return out.String() + errb.String(), err
	}
	ctx := context.Background()
	if out, err := run(ctx, "-tenants", tf); cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "migrate") {
		t.Fatalf("before -migrate: exit %d %v\n%s", cli.ExitCode(err), err, out)
	}
	if out, err := run(ctx, "-migrate"); err != nil || !strings.Contains(out, "applied 1 idempotency") {
		t.Fatalf("-migrate: %v\n%s", err, out)
	}
	if out, err := run(ctx, "-hash-token"); err != nil || !strings.Contains(out, intake.HashToken("acme-token")) {
		t.Fatalf("-hash-token: %v %s", err, out)
	}
	for _, bad := range [][]string{{"-tenants", tf, "-wait", "0s"}, {"-tenants", tf, "-tls-cert", "x"}, {"-tenants", filepath.Join(dir, "none.json")}, {"-tenants", tf, "-write-timeout", "1s", "-wait", "2s"}, {}} {
		if _, err := run(ctx, bad...); cli.ExitCode(err) != 2 {
			t.Errorf("%v: exit %d (%v), want 2", bad, cli.ExitCode(err), err)
		}
	}
	addr := freeAddr(t)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := run(cctx, "-tenants", tf, "-listen", addr, "-http", "", "-drain-delay", "100ms", "-read-header-timeout", "300ms")
		done <- err
	}()
	url := "http://" + addr
	var resp *http.Response
	for i := 0; ; i++ {
		var err error
		if resp, err = http.Get(url + "/readyz"); err == nil {
			break
		}
		if i > 200 {
			t.Fatalf("intake never listened: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp.Body.Close()
	c := &idempotency.Client{Policy: jitter.Policy{Base: time.Millisecond, MaxAttempts: 2}}
	res, err := c.Do(ctx, idempotency.Request{URL: url + intake.Route, Key: "cmd-1", Body: []byte(`{"subject":"intents.x","payload":1}`),
		Header: http.Header{"Authorization": {"Bearer acme-token"}}})
	if err != nil || res.Status != http.StatusAccepted {
		t.Fatalf("post: %+v %v", res, err)
	}
	// A header block over -max-header (16 KiB) is refused by the server.
	big, _ := http.NewRequest(http.MethodPost, url+intake.Route, strings.NewReader(`{}`))
	big.Header.Set("Authorization", "Bearer acme-token")
	big.Header.Set("X-Pad", strings.Repeat("p", 64<<10))
	if resp, err := http.DefaultClient.Do(big); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("a 64 KiB header: %v %v, want 431", resp, err)
	} else {
		resp.Body.Close()
	}
	// A slow client that never finishes its headers is cut off.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("POST /v1/intents HTTP/1.1\r\nHost: x\r\n"))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	io.Copy(io.Discard, conn)
	if time.Since(start) > 3*time.Second {
		t.Fatalf("a client that sent half its headers held the connection %v", time.Since(start))
	}
	conn.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("intake after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("intake did not drain and stop within 10 s")
	}
}
