// Package intake is `jetinbox intake`: the first hop of the pipeline, an
// HTTP server where clients POST intents with an Idempotency-Key. Each
// request stores its key, its answer and an outbox row (an inbox.Intent
// whose ID is derived from the scoped key) in one transaction of the
// intake's database and answers once that committed; the outbox relay
// publishes the row with Nats-Msg-Id = that ID. Any number of intakes run
// side by side behind a load balancer with nothing shared but the
// database.
package intake

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/idempotency/sqliteidempotency"
	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

// Route is where intents are posted; GET Route/{key} reads one's state.
const Route = "/v1/intents"

// Body is what a client posts: the subject and the payload, as JSON
// (payload) or as bytes in base64 (payload_base64).
type Body struct {
	Subject       string          `json:"subject"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadBase64 string          `json:"payload_base64,omitempty"`
}

// Accepted is the answer to a stored intent (202): it is in the outbox,
// and the relay publishes it with Nats-Msg-Id = ID.
type Accepted struct {
	ID      string `json:"id"`
	Subject string `json:"subject"`
	Key     string `json:"key"`
	State   string `json:"state"`
}

// Config is the server's configuration.
type Config struct {
	Tenants []Tenant
	// SubjectPrefix is the prefix of a tenant's subjects when its entry
	// names none.
	SubjectPrefix string
	// Rate and Burst are a tenant's request rate when its entry names
	// none.
	Rate  float64
	Burst int
	// MaxBody bounds a request body.
	MaxBody int64
	// Wait is how long a duplicate waits for its key's first request.
	Wait time.Duration
	Log  *slog.Logger
	// PartitionPrefix, on a sharded pipeline, is the partitioned stream's
	// subject prefix (such as "pintents"): a posted subject must be
	// PREFIX.REST, and the outbox row is published on PREFIX.<the ID's key
	// token>.REST, so that the stream puts it in its ID's partition. The
	// key and the row stay in the intake's own database whoever owns the
	// partition.
	PartitionPrefix string
	// KeyOptional accepts a POST without an Idempotency-Key as a new
	// intent every time (an ID of its own): a client that retries such a
	// request sends its intent twice. For comparisons only; off by default.
	KeyOptional bool
	// Registry, if set, gets the jetinbox_intake_* metrics.
	Registry prometheus.Registerer
}

// Server is the intake's HTTP handler.
type Server struct {
	cfg      Config
	byHash   map[string]*tenantState
	post     http.Handler
	lookup   func(ctx context.Context, sc idempotency.Scope) (*idempotency.Stored, error)
	state    func(ctx context.Context, id string) (string, error)
	ping     func(ctx context.Context) error
	draining atomic.Bool

	requests *prometheus.CounterVec
	seconds  prometheus.Histogram
	limited  *prometheus.CounterVec
}

type tenantState struct {
	Tenant
	bucket *bucket
}

type principalKey struct{}

// NewPG returns the intake on a PostgreSQL pool: keys in idempotency_keys,
// intents in the outbox, in one transaction.
func NewPG(pool *pgxpool.Pool, cfg Config) (*Server, error) {
	st := pgidempotency.New(pool)
	s, err := newServer(cfg)
	if err != nil {
		return nil, err
	}
	s.post = wrap(s, st, func(ctx context.Context, tx pgx.Tx, in inbox.Intent) error { return pgoutbox.Add(ctx, tx, in) })
	s.lookup = st.Lookup
	s.state = func(ctx context.Context, id string) (string, error) {
		var sent bool
		var failed string
		err := pool.QueryRow(ctx, `SELECT sent_at IS NOT NULL, coalesce(failed, '') FROM outbox WHERE id = $1`, id).Scan(&sent, &failed)
		if errors.Is(err, pgx.ErrNoRows) {
			return "unknown", nil
		}
		return stateOf(sent, failed), err
	}
	s.ping = pool.Ping
	return s, nil
}

// NewSQLite returns the intake on a SQLite file opened by sqliteinbox.Open.
func NewSQLite(db *sql.DB, cfg Config) (*Server, error) {
	st := sqliteidempotency.New(db)
	s, err := newServer(cfg)
	if err != nil {
		return nil, err
	}
	s.post = wrap(s, st, func(ctx context.Context, tx *sql.Tx, in inbox.Intent) error { return sqliteoutbox.Add(ctx, tx, in) })
	s.lookup = st.Lookup
	s.state = func(ctx context.Context, id string) (string, error) {
		var sent bool
		var failed string
		err := db.QueryRowContext(ctx, `SELECT sent_at IS NOT NULL, coalesce(failed, '') FROM outbox WHERE id = ?`, id).Scan(&sent, &failed)
		if errors.Is(err, sql.ErrNoRows) {
			return "unknown", nil
		}
		return stateOf(sent, failed), err
	}
	s.ping = db.PingContext
	return s, nil
}

func stateOf(sent bool, failed string) string {
	switch {
	case sent:
		return "published"
	case failed != "":
		return "failed: " + failed
	}
	return "pending"
}

func newServer(cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 64 << 10
	}
	s := &Server{cfg: cfg, byHash: map[string]*tenantState{}}
	for _, t := range cfg.Tenants {
		if t.Subjects == "" {
			t.Subjects = cfg.SubjectPrefix
		}
		rate, burst := t.Rate, t.Burst
		if rate == 0 {
			rate = cfg.Rate
		}
		if burst == 0 {
			burst = cfg.Burst
		}
		ts := &tenantState{Tenant: t}
		if rate > 0 {
			ts.bucket = newBucket(rate, max(burst, 1))
		}
		s.byHash[strings.ToLower(t.TokenSHA256)] = ts
	}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jetinbox_intake_requests_total",
		Help: "Intake requests by route and outcome (stored, replayed, mismatch, in_flight, transient, bad_key, refused)."}, []string{"route", "outcome"})
	s.limited = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jetinbox_intake_rate_limited_total",
		Help: "Requests refused with 429 by the per-tenant rate."}, []string{"tenant"})
	s.seconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "jetinbox_intake_request_seconds",
		Help: "Time to answer a POST of an intent.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)})
	if cfg.Registry != nil {
		for _, c := range []prometheus.Collector{s.requests, s.limited, s.seconds} {
			if err := cfg.Registry.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

func wrap[Tx any](s *Server, st idempotency.Store[Tx], add func(context.Context, Tx, inbox.Intent) error) http.Handler {
	cfg := idempotency.Config{
		Principal: func(r *http.Request) (string, bool) {
			t, ok := r.Context().Value(principalKey{}).(*tenantState)
			if !ok {
				return "", false
			}
			return t.Name, true
		},
		Wait:     s.cfg.Wait,
		Observer: func(route string, o idempotency.Outcome) { s.requests.WithLabelValues(route, string(o)).Inc() },
		Logger:   s.cfg.Log,
	}
	route := idempotency.Route{Name: Route, MaxBody: s.cfg.MaxBody, ReplayHeaders: []string{"Location"}, KeyOptional: s.cfg.KeyOptional}
	return idempotency.Wrap(st, cfg, route, func(w http.ResponseWriter, r *http.Request, tx Tx, raw []byte) error {
		t := r.Context().Value(principalKey{}).(*tenantState)
		key, _ := idempotency.ParseKey(r.Header.Get(idempotency.Header))
		if key == "" { // KeyOptional: every request is an intent of its own
			key = "unkeyed-" + idempotency.NewKey()
		}
		var b Body
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&b); err != nil {
			idempotency.Problem(w, http.StatusBadRequest, "bad-body", "want JSON {\"subject\": ..., \"payload\": ... or \"payload_base64\": ...}: "+err.Error())
			return nil
		}
		payload := []byte(b.Payload)
		if b.PayloadBase64 != "" {
			if len(b.Payload) > 0 {
				idempotency.Problem(w, http.StatusBadRequest, "bad-body", "payload and payload_base64 both given")
				return nil
			}
			p, err := base64.StdEncoding.DecodeString(b.PayloadBase64)
			if err != nil {
				idempotency.Problem(w, http.StatusBadRequest, "bad-body", "payload_base64: "+err.Error())
				return nil
			}
			payload = p
		}
		if t.Subjects != "" && !strings.HasPrefix(b.Subject, t.Subjects) {
			idempotency.Problem(w, http.StatusForbidden, "subject-not-allowed", fmt.Sprintf("tenant %s may post only to subjects starting with %q", t.Name, t.Subjects))
			return nil
		}
		sc := idempotency.Scope{Principal: t.Name, Method: r.Method, Route: Route, Key: key}
		in := inbox.Intent{ID: sc.ID(), Subject: b.Subject, Payload: payload}
		if p := s.cfg.PartitionPrefix; p != "" {
			rest, ok := strings.CutPrefix(b.Subject, p+".")
			if !ok || rest == "" {
				idempotency.Problem(w, http.StatusUnprocessableEntity, "bad-intent", fmt.Sprintf("subject %q: want %s.<kind>", b.Subject, p))
				return nil
			}
			in.Subject = shard.PublishSubject(p, in.ID, rest)
		}
		if err := in.Validate(); err != nil {
			idempotency.Problem(w, http.StatusUnprocessableEntity, "bad-intent", err.Error())
			return nil
		}
		if err := add(r.Context(), tx, in); err != nil {
			return fmt.Errorf("intake: outbox: %w", err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", Route+"/"+key)
		w.WriteHeader(http.StatusAccepted)
		return json.NewEncoder(w).Encode(Accepted{ID: in.ID, Subject: in.Subject, Key: key, State: "accepted"})
	})
}

// Drain makes /readyz answer 503, so the load balancer stops sending.
func (s *Server) Drain() { s.draining.Store(true) }

// ServeHTTP routes: POST /v1/intents, GET /v1/intents/{key}, /healthz,
// /readyz.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/healthz":
		w.Write([]byte("ok\n"))
		return
	case r.URL.Path == "/readyz":
		s.ready(w, r)
		return
	case r.URL.Path != Route && !strings.HasPrefix(r.URL.Path, Route+"/"):
		idempotency.Problem(w, http.StatusNotFound, "not-found", "POST "+Route+" or GET "+Route+"/{key}")
		return
	}
	t := s.authenticate(r)
	if t == nil {
		s.requests.WithLabelValues(Route, "unauthenticated").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="jetinbox"`)
		idempotency.Problem(w, http.StatusUnauthorized, "unauthenticated", "a valid bearer token is required")
		return
	}
	if t.bucket != nil {
		if ok, wait := t.bucket.take(time.Now()); !ok {
			s.limited.WithLabelValues(t.Name).Inc()
			w.Header().Set("Retry-After", fmt.Sprint(int(wait/time.Second)+1))
			idempotency.Problem(w, http.StatusTooManyRequests, "rate-limited", "this tenant's request rate is exhausted; retry after Retry-After")
			return
		}
	}
	r = r.WithContext(context.WithValue(r.Context(), principalKey{}, t))
	switch {
	case r.URL.Path == Route && r.Method == http.MethodPost:
		start := time.Now()
		s.post.ServeHTTP(w, r)
		s.seconds.Observe(time.Since(start).Seconds())
	case r.URL.Path != Route && r.Method == http.MethodGet:
		s.get(w, r, t, strings.TrimPrefix(r.URL.Path, Route+"/"))
	default:
		w.Header().Set("Allow", "POST, GET")
		idempotency.Problem(w, http.StatusMethodNotAllowed, "method-not-allowed", "POST "+Route+" or GET "+Route+"/{key}")
	}
}

func (s *Server) authenticate(r *http.Request) *tenantState {
	auth := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || token == "" || len(token) > 512 {
		return nil
	}
	return s.byHash[HashToken(token)]
}

// get answers the state of the intent posted with key by this tenant.
func (s *Server) get(w http.ResponseWriter, r *http.Request, t *tenantState, key string) {
	if err := idempotency.ValidateKey(key); err != nil {
		idempotency.Problem(w, http.StatusBadRequest, "bad-idempotency-key", err.Error())
		return
	}
	sc := idempotency.Scope{Principal: t.Name, Method: http.MethodPost, Route: Route, Key: key}
	st, err := s.lookup(r.Context(), sc)
	if err != nil {
		s.cfg.Log.Error("intake: lookup", "err", err)
		idempotency.Problem(w, http.StatusServiceUnavailable, "unavailable", "the key store is unavailable")
		return
	}
	if st == nil {
		idempotency.Problem(w, http.StatusNotFound, "unknown-key", "no intent was stored under this key for this tenant (or its retention passed)")
		return
	}
	out := map[string]any{"key": key, "status": st.Status, "created": st.Created.UTC().Format(time.RFC3339Nano)}
	var acc Accepted
	if st.Status == http.StatusAccepted && json.Unmarshal(st.Body, &acc) == nil {
		state, err := s.state(r.Context(), acc.ID)
		if err != nil {
			idempotency.Problem(w, http.StatusServiceUnavailable, "unavailable", "the outbox is unavailable")
			return
		}
		out["id"], out["subject"], out["state"] = acc.ID, acc.Subject, state
	} else {
		out["state"] = "refused"
		out["answer"] = json.RawMessage(nil)
		if json.Valid(st.Body) {
			out["answer"] = json.RawMessage(st.Body)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.ping(ctx); err != nil {
		http.Error(w, "database: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Write([]byte("ready\n"))
}
