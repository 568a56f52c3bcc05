package intake_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/sqliteidempotency"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/intake"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

// hostile is an intake on a SQLite file with two tenants, for the attacks
// of deploy/README.md: acme (the stolen token) and globex (the victim).
func hostile(t *testing.T, maxBody int64) (*httptest.Server, *sqliteidempotency.Store) {
	ctx := context.Background()
	db, err := sqliteinbox.Open(ctx, filepath.Join(t.TempDir(), "intake.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st := sqliteidempotency.New(db)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sqliteoutbox.New(db).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := intake.NewSQLite(db, intake.Config{Tenants: []intake.Tenant{
		{Name: "acme", TokenSHA256: intake.HashToken("acme-token"), Subjects: "intents.acme.", Rate: 20, Burst: 20},
		{Name: "globex", TokenSHA256: intake.HashToken("globex-token"), Subjects: "intents.globex."},
	}, MaxBody: maxBody, Wait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv, st
}

func send(t *testing.T, method, url, token, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set(idempotency.Header, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestIntakeStolenTenantToken: acme's token posts as acme, inside acme's
// subjects and rate, and nothing else.
func TestIntakeStolenTenantToken(t *testing.T) {
	srv, _ := hostile(t, 0)
	url := srv.URL + intake.Route
	code, victim := send(t, http.MethodPost, url, "globex-token", "invoice-9", `{"subject":"intents.globex.pay","payload":{"to":"globex"}}`)
	if code != http.StatusAccepted {
		t.Fatalf("globex: %d %s", code, victim)
	}
	if code, b := send(t, http.MethodPost, url, "acme-token", "k1", `{"subject":"intents.acme.pay"}`); code != http.StatusAccepted {
		t.Fatalf("acme in its own subjects: %d %s", code, b)
	}
	if code, b := send(t, http.MethodPost, url, "acme-token", "k2", `{"subject":"intents.globex.pay"}`); code != http.StatusForbidden {
		t.Fatalf("acme posting as globex's subjects: %d %s", code, b)
	}
	if code, b := send(t, http.MethodGet, url+"/invoice-9", "acme-token", "", ""); code != http.StatusNotFound || strings.Contains(b, "globex") {
		t.Fatalf("acme reading globex's key: %d %s", code, b)
	}
	if code, b := send(t, http.MethodPost, url, "acme-token", "invoice-9", `{"subject":"intents.acme.pay"}`); code != http.StatusAccepted || strings.Contains(b, "globex") {
		t.Fatalf("acme posting under globex's key: %d %s", code, b)
	}
	for _, tok := range []string{"", "ACME-TOKEN", strings.Repeat("a", 600), intake.HashToken("acme-token")} {
		if code, _ := send(t, http.MethodPost, url, tok, "k3", `{"subject":"intents.acme.pay"}`); code != http.StatusUnauthorized {
			t.Errorf("token %.20q: %d, want 401", tok, code)
		}
	}
}

// TestIntakeGuessedKeys: a tenant that guesses another's keys (GET and
// POST) finds nothing of theirs: each (tenant, key) is its own scope and
// its own intent ID.
func TestIntakeGuessedKeys(t *testing.T) {
	srv, _ := hostile(t, 0)
	url := srv.URL + intake.Route
	ids := map[string]string{}
	for _, tenant := range []string{"globex", "acme"} {
		_, b := send(t, http.MethodPost, url, tenant+"-token", "order-1", fmt.Sprintf(`{"subject":"intents.%s.x","payload":1}`, tenant))
		var acc intake.Accepted
		if err := json.Unmarshal([]byte(b), &acc); err != nil {
			t.Fatalf("%s: %s", tenant, b)
		}
		ids[tenant] = acc.ID
	}
	if ids["acme"] == ids["globex"] {
		t.Fatal("two tenants' same key gave one intent ID")
	}
	// Guessing is held to the tenant's rate too: 404, then 429.
	limited := 0
	for i := range 50 {
		switch code, _ := send(t, http.MethodGet, fmt.Sprintf("%s/order-%d", url, i+2), "acme-token", "", ""); code {
		case http.StatusNotFound:
		case http.StatusTooManyRequests:
			limited++
		default:
			t.Fatalf("acme's guess order-%d: %d", i+2, code)
		}
	}
	if limited == 0 {
		t.Fatal("50 guesses at once were not held to acme's rate")
	}
	time.Sleep(time.Second) // a token back
	if code, b := send(t, http.MethodGet, url+"/order-1", "acme-token", "", ""); code != 200 || !strings.Contains(b, ids["acme"]) || strings.Contains(b, ids["globex"]) {
		t.Fatalf("acme's own key: %d %s", code, b)
	}
}

// TestIntakeHugeKeysAndBodies: oversized keys, bodies and malformed keys
// are refused before anything is written.
func TestIntakeHugeKeysAndBodies(t *testing.T) {
	srv, st := hostile(t, 1024)
	url := srv.URL + intake.Route
	for name, key := range map[string]string{"256 bytes": strings.Repeat("k", 256), "64 KiB": strings.Repeat("k", 64<<10), "non-ASCII": "ключ", "quote": `"a"b"`} {
		if code, b := send(t, http.MethodPost, url, "acme-token", key, `{"subject":"intents.acme.x"}`); code != http.StatusBadRequest && code != 431 {
			t.Errorf("a %s key: %d %s", name, code, b)
		}
	}
	if code, b := send(t, http.MethodPost, url, "acme-token", "big", `{"subject":"intents.acme.x","payload":"`+strings.Repeat("x", 2048)+`"}`); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over -max-body: %d %s", code, b)
	}
	if s, err := st.Lookup(context.Background(), idempotency.Scope{Principal: "acme", Method: "POST", Route: intake.Route, Key: "big"}); err != nil || s != nil {
		t.Errorf("the refused body left a key: %+v %v", s, err)
	}
}

// TestIntakeKeyFlood: a tenant minting a new key per request is held to
// its rate (429 with Retry-After past its burst), and the keys it did get
// in are pruned once the retention has passed.
func TestIntakeKeyFlood(t *testing.T) {
	srv, st := hostile(t, 0)
	url := srv.URL + intake.Route
	accepted, limited := 0, 0
	for i := range 200 {
		code, _ := send(t, http.MethodPost, url, "acme-token", fmt.Sprintf("flood-%d", i), `{"subject":"intents.acme.x"}`)
		switch code {
		case http.StatusAccepted:
			accepted++
		case http.StatusTooManyRequests:
			limited++
		}
	}
	if accepted > 40 || limited < 150 {
		t.Fatalf("200 keys at once: %d accepted, %d refused with 429; acme's burst is 20", accepted, limited)
	}
	if code, _ := send(t, http.MethodPost, url, "globex-token", "other", `{"subject":"intents.globex.x"}`); code != http.StatusAccepted {
		t.Fatalf("globex during acme's flood: %d", code)
	}
	if _, err := st.Prune(context.Background(), idempotency.PruneOptions{OlderThan: time.Hour}); err == nil {
		t.Fatal("a prune inside the 24 h retention went through")
	}
}

// TestIntakeReadyAndDrain: /readyz answers 200 while the database does and
// 503 once the intake drains, so a load balancer stops sending; /healthz
// stays 200.
func TestIntakeReadyAndDrain(t *testing.T) {
	ctx := context.Background()
	db, err := sqliteinbox.Open(ctx, filepath.Join(t.TempDir(), "intake.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := intake.NewSQLite(db, intake.Config{Tenants: []intake.Tenant{{Name: "a", TokenSHA256: intake.HashToken("t")}}})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) int {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w.Code
	}
	if get("/readyz") != 200 || get("/healthz") != 200 {
		t.Fatalf("before the drain: readyz %d healthz %d", get("/readyz"), get("/healthz"))
	}
	s.Drain()
	if get("/readyz") != http.StatusServiceUnavailable || get("/healthz") != 200 {
		t.Fatalf("draining: readyz %d healthz %d", get("/readyz"), get("/healthz"))
	}
	db.Close()
	s2, _ := intake.NewSQLite(db, intake.Config{Tenants: []intake.Tenant{{Name: "a", TokenSHA256: intake.HashToken("t")}}})
	w := httptest.NewRecorder()
	s2.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("readyz with the database closed: %d", w.Code)
	}
}
