// Package idemtest is the conformance suite of the idempotency stores:
// the HTTP-level guarantees of package idempotency (key forms, scope,
// fingerprint, replay, transient answers, crashes around COMMIT,
// concurrent duplicates from two processes, retention) and the mutation
// tests that break one part on purpose and check that a guarantee test
// turns red. Each store's tests run it on a real database.
package idemtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/idempotency"
)

// Harness is one store under test.
type Harness[Tx any] struct {
	// Open returns a fresh database with the key table and an effects
	// table migrated.
	Open func(t testing.TB) DB[Tx]
	// SecondWriter: a second transaction can commit while a request's is
	// open (PostgreSQL; SQLite has one writer).
	SecondWriter bool
}

// DB is one fresh database of a harness.
type DB[Tx any] struct {
	// Store returns a new store on the database, as another process would
	// hold: its own connections.
	Store func() idempotency.Store[Tx]
	// Effect records what in the effects table, in tx: the handler's own
	// work.
	Effect func(ctx context.Context, tx Tx, what string) error
	// Effects counts the committed effects by what.
	Effects func(ctx context.Context) (map[string]int, error)
	// Age moves every key's claim time back by d.
	Age func(ctx context.Context, d time.Duration) error
	// Prune is the store's Prune; Keys counts the stored keys.
	Prune func(ctx context.Context, opts idempotency.PruneOptions) (int64, error)
	Keys  func(ctx context.Context) (int, error)
}

// Run runs the suite.
func Run[Tx any](t *testing.T, h Harness[Tx]) {
	s := suite[Tx]{h: h}
	for _, c := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"KeyForms", s.keyForms},
		{"Replay", s.guarantee(replayScenario[Tx])},
		{"Fingerprint", s.guarantee(fingerprintScenario[Tx])},
		{"Scope", s.guarantee(scopeScenario[Tx])},
		{"Transient", s.guarantee(transientScenario[Tx])},
		{"HandlerDecided4xx", s.decided4xx},
		{"CrashBeforeCommit", s.guarantee(crashScenario[Tx])},
		{"ConcurrentDuplicates", s.guarantee(concurrentScenario[Tx])},
		{"InFlightPastWait", s.inFlight},
		{"Prune", s.prune},
		{"MutationsAreCaught", s.mutations},
	} {
		t.Run(c.name, c.run)
	}
}

type suite[Tx any] struct{ h Harness[Tx] }

// env is one scenario's world: a database and a way to build handlers
// (each with a store of its own: a process).
type env[Tx any] struct {
	db    DB[Tx]
	wrap  func(DB[Tx], idempotency.Store[Tx]) idempotency.Store[Tx]
	ran   atomic.Int64 // handler runs past the claim
	fail  atomic.Int64 // commits to fail (crash before COMMIT)
	route idempotency.Route
	// answer is the handler's behaviour, by call number (1-based).
	answer func(n int64, w http.ResponseWriter, r *http.Request) error
}

// scenario checks one guarantee and returns what went wrong (nil: held).
type scenario[Tx any] func(ctx context.Context, e *env[Tx]) error

func (s suite[Tx]) newEnv(t *testing.T) *env[Tx] {
	return &env[Tx]{db: s.h.Open(t), wrap: func(_ DB[Tx], st idempotency.Store[Tx]) idempotency.Store[Tx] { return st },
		route: idempotency.Route{Name: "/v1/things", FingerprintHeaders: []string{"X-Currency"}, ReplayHeaders: []string{"X-Thing"}}}
}

// handler is a process: a store of its own, the route wrapped.
func (e *env[Tx]) handler(wait time.Duration) http.Handler {
	st := e.wrap(e.db, e.db.Store())
	st = &failingCommit[Tx]{Store: st, fail: &e.fail}
	cfg := idempotency.Config{
		Principal: func(r *http.Request) (string, bool) { p := r.Header.Get("X-Tenant"); return p, p != "" },
		Wait:      wait,
	}
	return idempotency.Wrap(st, cfg, e.route, func(w http.ResponseWriter, r *http.Request, tx Tx, body []byte) error {
		n := e.ran.Add(1)
		if err := e.db.Effect(r.Context(), tx, r.Header.Get("X-Tenant")+"/"+string(body)); err != nil {
			return err
		}
		if e.answer != nil {
			return e.answer(n, w, r)
		}
		w.Header().Set("X-Thing", fmt.Sprintf("thing-%d", n))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Not-Kept", "x")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d,"body":%q}`, n, body)
		return nil
	})
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (r reply) replayed() bool { return r.header.Get(idempotency.ReplayedHeader) == "true" }

func (r reply) String() string { return fmt.Sprintf("%d %s", r.status, strings.TrimSpace(r.body)) }

func do(h http.Handler, tenant, key, body string, hdr ...string) reply {
	req := httptest.NewRequest(http.MethodPost, "/v1/things", strings.NewReader(body))
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	if key != "" {
		req.Header.Set(idempotency.Header, key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return reply{w.Code, w.Header(), w.Body.String()}
}

func (e *env[Tx]) effects(ctx context.Context) (map[string]int, error) { return e.db.Effects(ctx) }

func (e *env[Tx]) wantEffects(ctx context.Context, want map[string]int) error {
	got, err := e.effects(ctx)
	if err != nil {
		return err
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("effects %v, want %v", got, want)
	}
	return nil
}

func (s suite[Tx]) guarantee(sc scenario[Tx]) func(t *testing.T) {
	return func(t *testing.T) {
		e := s.newEnv(t)
		if err := sc(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
}

// replayScenario: the second request with a key gets the first answer
// (status, the kept headers, body) marked replayed; the effect once.
func replayScenario[Tx any](ctx context.Context, e *env[Tx]) error {
	h := e.handler(5 * time.Second)
	first := do(h, "acme", `"k-1"`, "pay 5")
	if first.status != http.StatusCreated || first.replayed() {
		return fmt.Errorf("first: %v, replayed %v", first, first.replayed())
	}
	second := do(e.handler(5*time.Second), "acme", "k-1", "pay 5") // bare form, another process
	switch {
	case !second.replayed():
		return fmt.Errorf("second: %v not marked %s", second, idempotency.ReplayedHeader)
	case second.status != first.status || second.body != first.body:
		return fmt.Errorf("second %v, first %v", second, first)
	case second.header.Get("X-Thing") != first.header.Get("X-Thing") || second.header.Get("Content-Type") != "application/json":
		return fmt.Errorf("replayed headers %v, first %v", second.header, first.header)
	case second.header.Get("X-Not-Kept") != "":
		return errors.New("a header the route does not name was stored")
	}
	return e.wantEffects(ctx, map[string]int{"acme/pay 5": 1})
}

// fingerprintScenario: the same key with another body or another value of
// a fingerprint header is a 422 naming what differs; nothing runs.
func fingerprintScenario[Tx any](ctx context.Context, e *env[Tx]) error {
	h := e.handler(5 * time.Second)
	if r := do(h, "acme", "k", "pay 5", "X-Currency", "EUR"); r.status != http.StatusCreated {
		return fmt.Errorf("first: %v", r)
	}
	r := do(h, "acme", "k", "pay 500", "X-Currency", "EUR")
	if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.body, "body") || r.header.Get("Content-Type") != "application/problem+json" {
		return fmt.Errorf("other body: %v, want 422 naming the body", r)
	}
	r = do(h, "acme", "k", "pay 5", "X-Currency", "USD")
	if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.body, "X-Currency") {
		return fmt.Errorf("other X-Currency: %v, want 422 naming it", r)
	}
	return e.wantEffects(ctx, map[string]int{"acme/pay 5": 1})
}

// scopeScenario: two tenants with the same key each run once and never
// see the other's answer.
func scopeScenario[Tx any](ctx context.Context, e *env[Tx]) error {
	h := e.handler(5 * time.Second)
	a := do(h, "acme", "same", "a's order")
	b := do(h, "globex", "same", "b's order")
	if a.status != http.StatusCreated || b.status != http.StatusCreated || b.replayed() || strings.Contains(b.body, "a's") {
		return fmt.Errorf("tenant a: %v; tenant b with a's key: %v (replayed %v)", a, b, b.replayed())
	}
	if r := do(h, "globex", "same", "b's order"); !r.replayed() || r.body != b.body {
		return fmt.Errorf("tenant b's retry: %v", r)
	}
	return e.wantEffects(ctx, map[string]int{"acme/a's order": 1, "globex/b's order": 1})
}

// transientScenario: 503, 429 and a retryable handler error are not
// stored (their work rolls back); the retry runs and is stored.
func transientScenario[Tx any](ctx context.Context, e *env[Tx]) error {
	e.answer = func(n int64, w http.ResponseWriter, r *http.Request) error {
		switch n {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
			return nil
		case 2:
			w.WriteHeader(http.StatusTooManyRequests)
			return nil
		case 3:
			return idempotency.Retryable(errors.New("downstream busy"))
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "done")
		return nil
	}
	h := e.handler(5 * time.Second)
	for i, want := range []int{503, 429, 503, 201} {
		r := do(h, "acme", "k", "pay")
		if r.status != want || r.replayed() {
			return fmt.Errorf("attempt %d: %v (replayed %v), want %d run afresh", i+1, r, r.replayed(), want)
		}
		if want == 503 && r.header.Get("Retry-After") == "" && i == 2 {
			return fmt.Errorf("attempt %d: 503 without Retry-After", i+1)
		}
	}
	if r := do(h, "acme", "k", "pay"); !r.replayed() || r.status != 201 {
		return fmt.Errorf("after the stored answer: %v", r)
	}
	return e.wantEffects(ctx, map[string]int{"acme/pay": 1})
}

// decided4xx: a 4xx the handler decided is terminal: stored, replayed,
// its work committed once.
func (s suite[Tx]) decided4xx(t *testing.T) {
	e := s.newEnv(t)
	e.answer = func(n int64, w http.ResponseWriter, r *http.Request) error {
		http.Error(w, "no such account", http.StatusNotFound)
		return nil
	}
	h := e.handler(5 * time.Second)
	a, b := do(h, "acme", "k", "x"), do(h, "acme", "k", "x")
	if a.status != 404 || b.status != 404 || a.replayed() || !b.replayed() || e.ran.Load() != 1 {
		t.Fatalf("%v then %v (replayed %v), ran %d", a, b, b.replayed(), e.ran.Load())
	}
}

// crashScenario: a COMMIT that fails (the process died before it, the
// database went away) leaves nothing: the retry runs and applies once; an
// answer lost after COMMIT is replayed.
func crashScenario[Tx any](ctx context.Context, e *env[Tx]) error {
	h := e.handler(5 * time.Second)
	e.fail.Store(1)
	if r := do(h, "acme", "k", "pay 7"); r.status != http.StatusServiceUnavailable {
		return fmt.Errorf("failed commit answered %v, want 503", r)
	}
	if r := do(h, "acme", "k", "pay 7"); r.status != http.StatusCreated || r.replayed() {
		return fmt.Errorf("retry after a failed commit: %v (replayed %v), want 201 run afresh", r, r.replayed())
	}
	// The answer of that commit "lost on the way": the client retries.
	if r := do(h, "acme", "k", "pay 7"); !r.replayed() {
		return fmt.Errorf("retry after a lost answer: %v, want replayed", r)
	}
	return e.wantEffects(ctx, map[string]int{"acme/pay 7": 1})
}

// concurrentScenario: 8 duplicates at once across two processes: the
// handler runs once and every one gets its answer.
func concurrentScenario[Tx any](ctx context.Context, e *env[Tx]) error {
	e.answer = func(n int64, w http.ResponseWriter, r *http.Request) error {
		time.Sleep(300 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d", n)
		return nil
	}
	procs := []http.Handler{e.handler(10 * time.Second), e.handler(10 * time.Second)}
	var wg sync.WaitGroup
	replies := make([]reply, 8)
	for i := range replies {
		wg.Go(func() { replies[i] = do(procs[i%2], "acme", "burst", "pay 9") })
		if i == 0 {
			time.Sleep(50 * time.Millisecond) // the first one claims first
		}
	}
	wg.Wait()
	fresh := 0
	for i, r := range replies {
		if r.status != http.StatusCreated || r.body != "run 1" {
			return fmt.Errorf("duplicate %d: %v, want 201 run 1 (ran %d times)", i, r, e.ran.Load())
		}
		if !r.replayed() {
			fresh++
		}
	}
	if fresh != 1 || e.ran.Load() != 1 {
		return fmt.Errorf("%d answers not replayed, handler ran %d times; want 1 and 1", fresh, e.ran.Load())
	}
	return e.wantEffects(ctx, map[string]int{"acme/pay 9": 1})
}

// inFlight: a duplicate waits at most the bound, then gets 409 with
// Retry-After; after the first finished, the retry replays.
func (s suite[Tx]) inFlight(t *testing.T) {
	e := s.newEnv(t)
	release := make(chan struct{})
	e.answer = func(n int64, w http.ResponseWriter, r *http.Request) error {
		<-release
		w.WriteHeader(http.StatusCreated)
		return nil
	}
	h := e.handler(200 * time.Millisecond)
	firstDone := make(chan reply)
	go func() { firstDone <- do(h, "acme", "slow", "x") }()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	r := do(h, "acme", "slow", "x")
	waited := time.Since(start)
	if r.status != http.StatusConflict || r.header.Get("Retry-After") == "" {
		t.Fatalf("duplicate in flight: %v Retry-After %q, want 409 with it", r, r.header.Get("Retry-After"))
	}
	if waited > 3*time.Second {
		t.Fatalf("the duplicate waited %v, bound 200ms", waited)
	}
	close(release)
	if f := <-firstDone; f.status != http.StatusCreated {
		t.Fatalf("first: %v", f)
	}
	if r := do(h, "acme", "slow", "x"); !r.replayed() || e.ran.Load() != 1 {
		t.Fatalf("retry: %v, ran %d", r, e.ran.Load())
	}
}

func (s suite[Tx]) prune(t *testing.T) {
	e := s.newEnv(t)
	ctx := context.Background()
	h := e.handler(5 * time.Second)
	for i := range 5 {
		do(h, "acme", fmt.Sprintf("old-%d", i), "x")
	}
	if err := e.db.Age(ctx, 30*time.Hour); err != nil {
		t.Fatal(err)
	}
	do(h, "acme", "new", "x")
	if _, err := e.db.Prune(ctx, idempotency.PruneOptions{OlderThan: time.Hour}); !errors.Is(err, idempotency.ErrUnsafeHorizon) {
		t.Fatalf("a horizon under the default 24h retention: %v", err)
	}
	if _, err := e.db.Prune(ctx, idempotency.PruneOptions{OlderThan: 2 * time.Hour, Retention: 3 * time.Hour}); !errors.Is(err, idempotency.ErrUnsafeHorizon) {
		t.Fatalf("a horizon under a stated 3h retention: %v", err)
	}
	n, err := e.db.Prune(ctx, idempotency.PruneOptions{OlderThan: 25 * time.Hour, BatchSize: 2})
	if err != nil || n != 5 {
		t.Fatalf("pruned %d (%v), want the 5 old keys in batches of 2", n, err)
	}
	if k, err := e.db.Keys(ctx); err != nil || k != 1 {
		t.Fatalf("%d keys left (%v), want the new one", k, err)
	}
	if r := do(h, "acme", "new", "x"); !r.replayed() {
		t.Fatalf("the kept key: %v", r)
	}
}

func (s suite[Tx]) keyForms(t *testing.T) {
	e := s.newEnv(t)
	h := e.handler(5 * time.Second)
	if r := do(h, "acme", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "x"); r.status != 201 {
		t.Fatalf("sf-string key: %v", r)
	}
	if r := do(h, "acme", "8e03978e-40d5-43e8-bc93-6894a57f9324", "x"); !r.replayed() {
		t.Fatalf("the same key bare: %v, want the sf-string's answer", r)
	}
	for name, key := range map[string]string{
		"too long":     strings.Repeat("k", idempotency.MaxKeyLen+1),
		"space":        "a b",
		"unterminated": `"abc`,
		"bad escape":   `"a\nb"`,
		"non-ASCII":    "ключ",
		"empty quoted": `""`,
	} {
		r := do(h, "acme", key, "x")
		if r.status != http.StatusBadRequest || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s key: %v, want 400 problem+json", name, r)
		}
	}
	if r := do(h, "acme", strings.Repeat("k", idempotency.MaxKeyLen), "y"); r.status != 201 {
		t.Errorf("a key of %d bytes: %v", idempotency.MaxKeyLen, r)
	}
	if r := do(h, "acme", "", "x"); r.status != http.StatusBadRequest || !strings.Contains(r.body, "missing") {
		t.Errorf("no key: %v, want 400", r)
	}
	if r := do(h, "", "k", "x"); r.status != http.StatusUnauthorized {
		t.Errorf("no principal: %v, want 401", r)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/things", strings.NewReader("x"))
	req.Header.Set("X-Tenant", "acme")
	req.Header.Add(idempotency.Header, "a")
	req.Header.Add(idempotency.Header, "b")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusBadRequest {
		t.Errorf("two keys: %d", w.Code)
	}
	e.route.MaxBody = 8
	if r := do(e.handler(time.Second), "acme", "big", strings.Repeat("b", 9)); r.status != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over the limit: %v", r)
	}
	if got := e.ran.Load(); got != 2 {
		t.Errorf("the handler ran %d times, want 2 (the refused requests never reach it)", got)
	}
}
