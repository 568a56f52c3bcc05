package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// HandlerFunc is a route's work: it runs inside tx, the transaction that
// holds the request's key, and writes its answer to w. The answer is
// stored (and sent) only if tx commits, and it commits only for a
// terminal answer; the handler must not commit or roll back tx itself.
// body is the request body, read already (r.Body is empty).
type HandlerFunc[Tx any] func(w http.ResponseWriter, r *http.Request, tx Tx, body []byte) error

// Route describes one endpoint.
type Route struct {
	// Name is the route as the scope and fingerprint see it, such as
	// "/v1/intents". Required: requests of different routes never share
	// a key.
	Name string
	// KeyOptional lets requests without a key through, run once each in
	// a transaction of their own; by default a missing key is a 400.
	KeyOptional bool
	// FingerprintHeaders are request headers that belong to the request's
	// meaning (a currency, an account header): the same key with other
	// values of them is a 422.
	FingerprintHeaders []string
	// ReplayHeaders are response headers stored with the answer and sent
	// again on replay. Content-Type always is.
	ReplayHeaders []string
	// MaxBody is the largest request body accepted (413 above). Default
	// 1 MiB.
	MaxBody int64
	// Webhooks, if set, makes the route a Standard Webhooks receiver:
	// signatures verified, webhook-id the key (see [Webhooks]).
	Webhooks *Webhooks
}

// Config is what every route of a service shares.
type Config struct {
	// Principal returns who the request is authenticated as, and false
	// when it is not (401). Keys are scoped by it. Required.
	Principal func(r *http.Request) (string, bool)
	// Wait is how long a duplicate waits for the request in flight with
	// its key before it gets 409. Default 5 s.
	Wait time.Duration
	// RetryAfter is the Retry-After sent with 409 and 503, rounded up to
	// whole seconds. Default 1 s.
	RetryAfter time.Duration
	// Observer, if set, hears every request's outcome.
	Observer func(route string, o Outcome)
	// Logger, if set, logs refusals and errors. Default slog.Default().
	Logger *slog.Logger
}

// Outcome is how a request ended, for metrics.
type Outcome string

// The outcomes.
const (
	OutcomeStored    Outcome = "stored"    // ran, answer committed
	OutcomeReplayed  Outcome = "replayed"  // answer of an earlier request sent again
	OutcomeMismatch  Outcome = "mismatch"  // 422: same key, other fingerprint
	OutcomeInFlight  Outcome = "in_flight" // 409: the first request still runs
	OutcomeTransient Outcome = "transient" // rolled back: 408, 429, 5xx, handler error
	OutcomeBadKey    Outcome = "bad_key"   // 400: malformed or missing key
	OutcomeRefused   Outcome = "refused"   // 401, 413 before anything ran
	OutcomeNoKey     Outcome = "no_key"    // ran without a key (KeyOptional)
)

// retryable marks an error the client should retry.
type retryable struct{ err error }

func (r retryable) Error() string { return r.err.Error() }
func (r retryable) Unwrap() error { return r.err }

// Retryable marks err as transient: the handler's transaction is rolled
// back and the client gets 503 with Retry-After, so its retry runs the
// request again. Any other handler error is a 500, rolled back too.
func Retryable(err error) error { return retryable{err} }

// IsRetryable reports whether err was marked with [Retryable].
func IsRetryable(err error) bool { var r retryable; return errors.As(err, &r) }

// Terminal reports whether an answer of status is stored: 2xx, 3xx and
// 4xx except 408 and 429. The others are transient: the retry must run.
func Terminal(status int) bool {
	return status >= 200 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
}

// Handler is a route wrapped with its key store.
type Handler[Tx any] struct {
	st    Store[Tx]
	cfg   Config
	route Route
	h     HandlerFunc[Tx]
	log   *slog.Logger
	keep  map[string]bool

	mu       sync.Mutex
	inFlight map[[32]byte]int
}

// Wrap returns route's handler h behind the key store st.
func Wrap[Tx any](st Store[Tx], cfg Config, route Route, h HandlerFunc[Tx]) *Handler[Tx] {
	if cfg.Wait <= 0 {
		cfg.Wait = 5 * time.Second
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = time.Second
	}
	if route.MaxBody <= 0 {
		route.MaxBody = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	keep := map[string]bool{"Content-Type": true}
	for _, k := range route.ReplayHeaders {
		keep[http.CanonicalHeaderKey(k)] = true
	}
	return &Handler[Tx]{st: st, cfg: cfg, route: route, h: h, log: cfg.Logger, keep: keep, inFlight: map[[32]byte]int{}}
}

func (h *Handler[Tx]) observe(o Outcome) {
	if h.cfg.Observer != nil {
		h.cfg.Observer(h.route.Name, o)
	}
}

// ServeHTTP implements http.Handler.
func (h *Handler[Tx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	principal, ok := h.cfg.Principal(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", "Bearer")
		h.observe(OutcomeRefused)
		Problem(w, http.StatusUnauthorized, "unauthenticated", "a valid bearer token is required")
		return
	}
	var key string
	vs := r.Header.Values(Header)
	if h.route.Webhooks != nil {
		if !h.webhook(w, r) {
			return
		}
		vs = r.Header.Values(Header)
	}
	switch {
	case len(vs) > 1:
		h.observe(OutcomeBadKey)
		Problem(w, http.StatusBadRequest, "bad-idempotency-key", "more than one Idempotency-Key header")
		return
	case len(vs) == 1:
		k, err := ParseKey(vs[0])
		if err != nil {
			h.observe(OutcomeBadKey)
			Problem(w, http.StatusBadRequest, "bad-idempotency-key", err.Error())
			return
		}
		key = k
	case !h.route.KeyOptional:
		h.observe(OutcomeBadKey)
		Problem(w, http.StatusBadRequest, "missing-idempotency-key", "this route requires an Idempotency-Key header")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, h.route.MaxBody+1))
	if err != nil {
		h.observe(OutcomeRefused)
		Problem(w, http.StatusBadRequest, "unreadable-body", err.Error())
		return
	}
	if int64(len(body)) > h.route.MaxBody {
		h.observe(OutcomeRefused)
		Problem(w, http.StatusRequestEntityTooLarge, "body-too-large", fmt.Sprintf("the body is larger than %d bytes", h.route.MaxBody))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	ctx := r.Context()
	s := Scope{Principal: principal, Method: r.Method, Route: h.route.Name, Key: key}
	fp := RequestFingerprint(r.Method, h.route.Name, r.Header, h.route.FingerprintHeaders, body)

	if key != "" {
		sum := s.Hash()
		h.mu.Lock()
		h.inFlight[sum]++
		h.mu.Unlock()
		defer func() {
			h.mu.Lock()
			if h.inFlight[sum]--; h.inFlight[sum] == 0 {
				delete(h.inFlight, sum)
			}
			h.mu.Unlock()
		}()
	}
	tx, err := h.st.Begin(ctx, h.cfg.Wait)
	if err != nil {
		h.busyOrUnavailable(w, s, err)
		return
	}
	done := false
	defer func() {
		if !done {
			if err := h.st.Rollback(context.WithoutCancel(ctx), tx); err != nil {
				h.log.Warn("idempotency: rollback", "route", h.route.Name, "err", err)
			}
		}
	}()
	if key != "" {
		stored, err := h.st.Claim(ctx, tx, s, fp, h.cfg.Wait)
		if err != nil {
			h.busyOrUnavailable(w, s, err)
			return
		}
		if stored != nil {
			if d := stored.Fingerprint.Diff(fp); len(d) > 0 {
				h.observe(OutcomeMismatch)
				Problem(w, http.StatusUnprocessableEntity, "idempotency-key-reused",
					fmt.Sprintf("this Idempotency-Key was used with another request; what differs: %s", strings.Join(d, ", ")))
				return
			}
			// The answer rests on an earlier commit: replay it only once
			// a commit of this transaction has waited for it to be as
			// durable as a fresh one (a synchronous standby confirmed).
			err := h.st.ReadPriorCommits(ctx, tx)
			if err == nil {
				done = true
				err = h.st.Commit(ctx, tx)
			}
			if err != nil {
				h.observe(OutcomeTransient)
				h.log.Error("idempotency: confirm the stored answer", "route", h.route.Name, "err", err)
				h.retryLater(w, http.StatusServiceUnavailable, "outcome-unknown", "the stored answer could not be confirmed durable; retry with the same Idempotency-Key")
				return
			}
			h.observe(OutcomeReplayed)
			replay(w, stored.Answer)
			return
		}
	}
	rec := &recorder{header: http.Header{}}
	herr := h.run(rec, r, tx, body)
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	switch {
	case herr != nil:
		h.observe(OutcomeTransient)
		if IsRetryable(herr) {
			h.log.Info("idempotency: handler asked for a retry", "route", h.route.Name, "err", herr)
			h.retryLater(w, http.StatusServiceUnavailable, "retry", "the request could not be completed now; retry with the same Idempotency-Key")
			return
		}
		h.log.Error("idempotency: handler failed", "route", h.route.Name, "err", herr)
		Problem(w, http.StatusInternalServerError, "handler-failed", "the request failed and nothing was stored; a retry with the same Idempotency-Key runs it again")
		return
	case !Terminal(status):
		h.observe(OutcomeTransient)
		rec.sendTo(w, status)
		return
	}
	a := Answer{Status: status, Header: http.Header{}, Body: rec.body.Bytes()}
	for k, v := range rec.header {
		if h.keep[k] {
			a.Header[k] = v
		}
	}
	if key != "" {
		if err := h.st.Complete(ctx, tx, s, a); err != nil {
			h.observe(OutcomeTransient)
			h.log.Error("idempotency: store the answer", "route", h.route.Name, "err", err)
			h.retryLater(w, http.StatusServiceUnavailable, "store-failed", "the answer could not be stored; nothing was committed, retry with the same Idempotency-Key")
			return
		}
	}
	done = true
	if err := h.st.Commit(ctx, tx); err != nil {
		h.observe(OutcomeTransient)
		h.log.Error("idempotency: commit", "route", h.route.Name, "err", err)
		// The outcome is unknown: a retry with the same key either
		// replays the answer (it committed) or runs the request.
		h.retryLater(w, http.StatusServiceUnavailable, "outcome-unknown", "the commit did not confirm; retry with the same Idempotency-Key, which replays the answer if it committed")
		return
	}
	if key == "" {
		h.observe(OutcomeNoKey)
	} else {
		h.observe(OutcomeStored)
	}
	rec.sendTo(w, status)
}

// webhook verifies a Standard Webhooks request and makes its webhook-id
// the request's Idempotency-Key; false when it answered already.
func (h *Handler[Tx]) webhook(w http.ResponseWriter, r *http.Request) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, h.route.MaxBody+1))
	if err != nil || int64(len(body)) > h.route.MaxBody {
		h.observe(OutcomeRefused)
		Problem(w, http.StatusRequestEntityTooLarge, "body-too-large", fmt.Sprintf("the body is unreadable or larger than %d bytes", h.route.MaxBody))
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	id, err := h.route.Webhooks.Verify(r.Header, body)
	if err != nil {
		h.observe(OutcomeRefused)
		Problem(w, http.StatusUnauthorized, "bad-webhook-signature", err.Error())
		return false
	}
	if vs := r.Header.Values(Header); len(vs) > 0 {
		if k, err := ParseKey(vs[0]); len(vs) > 1 || err != nil || k != id {
			h.observe(OutcomeBadKey)
			Problem(w, http.StatusBadRequest, "bad-idempotency-key", "Idempotency-Key differs from webhook-id")
			return false
		}
	}
	r.Header.Set(Header, FormatKey(id))
	return true
}

// run calls the handler, turning a panic into an error (the transaction
// rolls back).
func (h *Handler[Tx]) run(w http.ResponseWriter, r *http.Request, tx Tx, body []byte) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			err = fmt.Errorf("idempotency: handler panicked: %v", p)
		}
	}()
	return h.h(w, r, tx, body)
}

func (h *Handler[Tx]) busyOrUnavailable(w http.ResponseWriter, s Scope, err error) {
	if errors.Is(err, ErrBusy) {
		inHere := false
		if s.Key != "" {
			h.mu.Lock()
			inHere = h.inFlight[s.Hash()] > 1
			h.mu.Unlock()
		}
		if inHere || errors.Is(err, errKeyHeld) {
			h.observe(OutcomeInFlight)
			h.retryLater(w, http.StatusConflict, "request-in-flight", "a request with this Idempotency-Key is still being processed; retry later")
			return
		}
		h.observe(OutcomeTransient)
		h.retryLater(w, http.StatusServiceUnavailable, "busy", "the database is busy; retry with the same Idempotency-Key")
		return
	}
	h.observe(OutcomeTransient)
	h.log.Error("idempotency: claim", "route", h.route.Name, "err", err)
	h.retryLater(w, http.StatusServiceUnavailable, "unavailable", "the key store is unavailable; retry with the same Idempotency-Key")
}

// errKeyHeld is wrapped (with ErrBusy) by a store whose wait was on the
// key itself (PostgreSQL's row lock), not on the database.
var errKeyHeld = errors.New("the key's row is locked")

// KeyHeld returns an error wrapping [ErrBusy] that says the wait was on
// the key itself: a store returns it when another transaction held the
// key's row past the wait.
func KeyHeld(err error) error { return fmt.Errorf("%w: %w: %w", ErrBusy, errKeyHeld, err) }

func (h *Handler[Tx]) retryLater(w http.ResponseWriter, status int, kind, detail string) {
	secs := int((h.cfg.RetryAfter + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	Problem(w, status, kind, detail)
}

func replay(w http.ResponseWriter, a Answer) {
	for k, v := range a.Header {
		w.Header()[k] = v
	}
	w.Header().Set(ReplayedHeader, "true")
	w.Header().Set("Content-Length", strconv.Itoa(len(a.Body)))
	w.WriteHeader(a.Status)
	w.Write(a.Body)
}

// Problem writes an application/problem+json answer (RFC 9457).
func Problem(w http.ResponseWriter, status int, kind, detail string) {
	b, _ := json.Marshal(map[string]any{
		"type":   "urn:jetinbox:problem:" + kind,
		"title":  http.StatusText(status),
		"status": status,
		"detail": detail,
	})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// recorder buffers the handler's answer until the transaction committed.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

func (r *recorder) sendTo(w http.ResponseWriter, status int) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(r.body.Len()))
	w.WriteHeader(status)
	w.Write(r.body.Bytes())
}
