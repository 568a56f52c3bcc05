package delivery

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetinbox/jetinbox/internal/deliveryhook"
	"github.com/jetinbox/jetinbox/jitter"
)

// Observer hears what a dispatcher does, for metrics (package metrics'
// Delivery implements it). Its methods must not block.
type Observer interface {
	// Attempted hears every finished attempt: its endpoint, its outcome
	// (the state it left the row in: "delivered", "retry", "dead") and
	// how long the call took.
	Attempted(endpoint string, outcome State, took time.Duration)
	// BreakerChanged hears an endpoint's breaker change state.
	BreakerChanged(endpoint string, s BreakerState)
}

// DeadObserver is an [Observer] that is also told why a row was
// dead-lettered: unknown is true for "outcome unknown: reconcile" (no
// answer known and the receiver's key retention has passed: ask the
// receiver before re-driving), false for a refusal (a permanent 4xx or a
// redirect: fix, then re-drive).
type DeadObserver interface {
	Observer
	DeadLettered(endpoint string, unknown bool)
}

// Config configures a [Dispatcher].
type Config struct {
	// Endpoints are the receivers, as [LoadEndpoints] or
	// [CheckEndpoints] returned them. Required.
	Endpoints []Endpoint
	// Owner names the dispatcher in its leases. Default host name, process
	// ID and a random suffix.
	Owner string
	// Lease is how long a leased row is the dispatcher's alone: a
	// dispatcher that dies leaves its rows to others after it. It must be
	// longer than every endpoint's Timeout. Default 2 × the longest
	// Timeout, at least 30s.
	Lease time.Duration
	// Retry draws the wait before attempt n+1 after a failed attempt n
	// (Retry.Delay(n)); a longer Retry-After wins. Default decorrelated
	// jitter, Base 1s, Cap 5m.
	Retry jitter.Policy
	// Idle is the wait between polls when nothing is due. Default
	// decorrelated jitter, Base 200ms, Cap 2s.
	Idle jitter.Policy
	// Breaker configures every endpoint's circuit breaker.
	Breaker BreakerConfig
	// MaxBody is how many bytes of an answer's body are read and
	// recorded; the rest is never read. Default 1024.
	MaxBody int
	// Observer, if set, hears every attempt and breaker change.
	Observer Observer
	// Logger logs failures. Default slog.Default().
	Logger *slog.Logger
}

// Stats counts what a dispatcher did.
type Stats struct {
	Attempts, Delivered, Retried, Dead, LeaseLost int64
}

// Dispatcher sends the deliveries of a [Store] to their endpoints: one
// loop per endpoint, each with its own concurrency limit and circuit
// breaker, so a slow or failing endpoint holds only its own slots. Any
// number of dispatchers may share a store: each leases its own rows.
type Dispatcher struct {
	st     Store
	cfg    Config
	eps    []*endpointState
	log    *slog.Logger
	faults *deliveryhook.Faults

	attempts, delivered, retried, dead, leaseLost atomic.Int64
}

type endpointState struct {
	Endpoint
	client *http.Client
	sem    chan struct{}
	br     *breaker
	wake   chan struct{}
}

func init() {
	deliveryhook.Register(func(target any, f *deliveryhook.Faults) bool {
		d, ok := target.(*Dispatcher)
		if ok {
			d.faults = f
		}
		return ok
	})
}

// NewDispatcher returns a dispatcher of st's rows to cfg.Endpoints.
func NewDispatcher(st Store, cfg Config) (*Dispatcher, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: no store", ErrConfig)
	}
	eps, err := CheckEndpoints(cfg.Endpoints)
	if err != nil {
		return nil, err
	}
	cfg.Endpoints = eps
	longest := time.Duration(0)
	for _, e := range eps {
		longest = max(longest, time.Duration(e.Timeout))
	}
	if cfg.Lease == 0 {
		cfg.Lease = max(2*longest, 30*time.Second)
	}
	if cfg.Lease <= longest {
		return nil, fmt.Errorf("%w: lease %v must be longer than the longest endpoint timeout %v", ErrConfig, cfg.Lease, longest)
	}
	if cfg.Owner == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.Owner = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if cfg.Retry.Base == 0 {
		cfg.Retry.Base = time.Second
	}
	if cfg.Retry.Cap == 0 {
		cfg.Retry.Cap = 5 * time.Minute
	}
	if cfg.Idle.Base == 0 {
		cfg.Idle.Base = 200 * time.Millisecond
	}
	if cfg.Idle.Cap == 0 {
		cfg.Idle.Cap = 2 * time.Second
	}
	if err := errors.Join(cfg.Retry.Validate(), cfg.Idle.Validate()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	cfg.Breaker = cfg.Breaker.withDefaults()
	if err := cfg.Breaker.Open.Validate(); err != nil {
		return nil, fmt.Errorf("%w: breaker: %w", ErrConfig, err)
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Dispatcher{st: st, cfg: cfg, log: cfg.Logger}
	for _, e := range eps {
		es := &endpointState{Endpoint: e, sem: make(chan struct{}, e.Concurrency), wake: make(chan struct{}, 1),
			br: &breaker{cfg: cfg.Breaker}, client: newClient(e)}
		if cfg.Observer != nil {
			name, obs := e.Name, cfg.Observer
			es.br.changed = func(s BreakerState) { obs.BreakerChanged(name, s) }
			obs.BreakerChanged(name, BreakerClosed)
		}
		d.eps = append(d.eps, es)
	}
	return d, nil
}

// newClient returns the endpoint's HTTP client: TLS verified, redirects
// never followed, headers bounded, no proxy from the environment.
func newClient(e Endpoint) *http.Client {
	tr := &http.Transport{
		DialContext:            (&net.Dialer{Timeout: time.Duration(e.Timeout), KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:        e.tls,
		TLSHandshakeTimeout:    time.Duration(e.Timeout),
		ResponseHeaderTimeout:  time.Duration(e.Timeout),
		MaxResponseHeaderBytes: 64 << 10,
		MaxIdleConnsPerHost:    e.Concurrency,
		MaxConnsPerHost:        e.Concurrency,
		IdleConnTimeout:        90 * time.Second,
		ForceAttemptHTTP2:      true,
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// Config returns the configuration with its defaults filled in.
func (d *Dispatcher) Config() Config { return d.cfg }

// Stats returns what the dispatcher did so far.
func (d *Dispatcher) Stats() Stats {
	return Stats{Attempts: d.attempts.Load(), Delivered: d.delivered.Load(), Retried: d.retried.Load(), Dead: d.dead.Load(), LeaseLost: d.leaseLost.Load()}
}

// Breaker returns the state of the named endpoint's breaker.
func (d *Dispatcher) Breaker(endpoint string) BreakerState {
	for _, e := range d.eps {
		if e.Name == endpoint {
			return e.br.State()
		}
	}
	return BreakerClosed
}

// Run sends deliveries until ctx ends, then waits for the calls in flight
// and records their outcomes. It returns nil after ctx ends.
func (d *Dispatcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, e := range d.eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.loop(ctx, e)
		}()
	}
	wg.Wait()
	for _, e := range d.eps {
		e.client.CloseIdleConnections()
	}
	return nil
}

// loop is one endpoint's: lease as many due rows as there are free slots
// (one while the breaker probes), send each in its own goroutine.
func (d *Dispatcher) loop(ctx context.Context, e *endpointState) {
	var calls sync.WaitGroup
	defer calls.Wait()
	idle := 0
	for ctx.Err() == nil {
		free := cap(e.sem) - len(e.sem)
		if free == 0 {
			if !sleep(ctx, e.wake, d.cfg.Idle.Base) {
				return
			}
			continue
		}
		n, retryAt := e.br.slots(time.Now(), free)
		if n == free && e.br.State() == BreakerClosed {
			// Lease one round ahead, so a freed slot does not wait for a
			// lease of its own: each extra row waits at most one call,
			// well inside the lease (longer than twice the timeout).
			n += cap(e.sem)
		}
		if n == 0 {
			if !sleep(ctx, nil, time.Until(retryAt)) {
				return
			}
			continue
		}
		rows, err := d.st.Lease(ctx, d.cfg.Owner, e.Name, n, d.cfg.Lease)
		if err != nil {
			if e.br.State() == BreakerHalfOpen {
				e.br.unprobe()
			}
			if ctx.Err() != nil {
				return
			}
			idle++
			d.log.Warn("delivery: lease", "endpoint", e.Name, "err", err)
			if !sleep(ctx, nil, d.cfg.Idle.Delay(idle)) {
				return
			}
			continue
		}
		if len(rows) == 0 {
			if e.br.State() == BreakerHalfOpen {
				e.br.unprobe()
			}
			idle++
			if !sleep(ctx, e.wake, d.cfg.Idle.Delay(idle)) {
				return
			}
			continue
		}
		idle = 0
	rows:
		for i, r := range rows {
			select {
			case e.sem <- struct{}{}:
			default:
				// A row leased ahead of the free slots: wait for one,
				// unless the dispatcher stops or the breaker opened; then
				// give the rest back, due now, unsent.
				if ctx.Err() == nil && e.br.State() == BreakerClosed {
					select {
					case e.sem <- struct{}{}:
					case <-ctx.Done():
					}
				}
				if ctx.Err() != nil || e.br.State() != BreakerClosed {
					d.release(ctx, e, rows[i:])
					break rows
				}
			}
			calls.Add(1)
			go func() {
				defer calls.Done()
				defer func() {
					<-e.sem
					select {
					case e.wake <- struct{}{}:
					default:
					}
				}()
				d.deliver(ctx, e, r)
			}()
		}
	}
}

// release gives rows leased ahead back unsent: pending, due now.
func (d *Dispatcher) release(ctx context.Context, e *endpointState, rows []Delivery) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, r := range rows {
		if err := d.st.Record(rctx, d.cfg.Owner, r.ID, Result{State: StatePending, Reason: "not sent: leased ahead, given back"}); err != nil {
			d.log.Warn("delivery: give back a row leased ahead (its lease runs out instead)", "endpoint", e.Name, "id", r.ID, "err", err)
		}
	}
}

// sleep waits for dt, a wake-up or the end of ctx; false when ctx ended.
func sleep(ctx context.Context, wake <-chan struct{}, dt time.Duration) bool {
	if dt <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(dt)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-t.C:
	}
	return true
}

// errUnknown marks a result whose outcome at the receiver is unknown.
const reasonUnknown = "outcome unknown: reconcile"

// deliver makes one attempt of r and records its outcome. A call is never
// made for a row past its key retention; a call that is made is recorded
// only after its answer (or its failure) is in.
func (d *Dispatcher) deliver(ctx context.Context, e *endpointState, r Delivery) {
	retention := time.Duration(e.KeyRetention)
	start := time.Now()
	var res Result
	if r.Attempts > 1 && start.Sub(r.FirstAttempt) > retention {
		res = Result{State: StateDead, Reason: fmt.Sprintf("%s: no answer known, and the receiver's key retention (%v) has passed since the first attempt at %s", reasonUnknown, retention, r.FirstAttempt.UTC().Format(time.RFC3339))}
		e.br.unprobeIfProbing()
	} else {
		d.attempts.Add(1)
		var ok bool
		res, ok = d.call(ctx, e, r)
		e.br.record(time.Now(), ok)
		if d.faults != nil && d.faults.SkipRecord != nil && d.faults.SkipRecord() {
			return // killed between the call and recording its outcome
		}
		if res.State == StatePending {
			wait := max(d.cfg.Retry.Delay(r.Attempts), res.RetryIn)
			if next := time.Now().Add(wait); next.Sub(r.FirstAttempt) > retention {
				res = Result{State: StateDead, Status: res.Status, Body: res.Body,
					Reason: fmt.Sprintf("%s: last attempt: %s; the next (in %v) would come after the receiver's key retention (%v) since the first attempt", reasonUnknown, res.Reason, wait.Round(time.Millisecond), retention)}
			} else {
				res.RetryIn = wait
			}
		}
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := d.st.Record(rctx, d.cfg.Owner, r.ID, res)
	switch {
	case errors.Is(err, ErrLeaseLost):
		d.leaseLost.Add(1)
		d.log.Warn("delivery: lease lost before the outcome was recorded (make the lease longer than the endpoint's timeout); another dispatcher sends it again with the same key", "endpoint", e.Name, "id", r.ID)
		return
	case err != nil:
		// The lease runs out and the row is sent again with the same key.
		d.log.Error("delivery: record outcome", "endpoint", e.Name, "id", r.ID, "err", err)
		return
	}
	switch res.State {
	case StateDelivered:
		d.delivered.Add(1)
	case StateDead:
		d.dead.Add(1)
		d.log.Warn("delivery: dead-lettered", "endpoint", e.Name, "id", r.ID, "message_id", r.MessageID, "status", res.Status, "reason", res.Reason)
	default:
		d.retried.Add(1)
	}
	if d.cfg.Observer != nil {
		d.cfg.Observer.Attempted(e.Name, res.State, time.Since(start))
		if o, ok := d.cfg.Observer.(DeadObserver); ok && res.State == StateDead {
			o.DeadLettered(e.Name, strings.HasPrefix(res.Reason, reasonUnknown))
		}
	}
}

func (b *breaker) unprobeIfProbing() {
	if b.State() == BreakerHalfOpen {
		b.unprobe()
	}
}

// call POSTs r to e and classifies the answer. ok reports the endpoint
// healthy for the breaker (an answer that is not a failure of the
// receiver: 2xx, or a permanent 4xx about this message).
func (d *Dispatcher) call(ctx context.Context, e *endpointState, r Delivery) (Result, bool) {
	key := r.Key
	if d.faults != nil && d.faults.NewKeyPerAttempt {
		key = Key(r.Scope, r.MessageID+"#"+strconv.Itoa(r.Attempts), r.Endpoint) // unsafe: the receiver cannot recognise a retry
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(e.Timeout))
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, e.URL, bytes.NewReader(r.Payload))
	if err != nil {
		return Result{State: StateDead, Reason: "request: " + err.Error()}, true
	}
	now := time.Now()
	req.Header.Set("Content-Type", e.ContentType)
	req.Header.Set("User-Agent", "jetinbox-deliver")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	req.Header.Set(HeaderID, key)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	if len(e.secrets) > 0 {
		req.Header.Set(HeaderSignature, Sign(e.secrets, key, now, r.Payload))
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return Result{State: StatePending, Reason: "outcome unknown: " + err.Error()}, false
	}
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, int64(d.cfg.MaxBody)))
	resp.Body.Close() // the rest of a large body is never read
	res := Result{Status: resp.StatusCode, Body: body}
	s := resp.StatusCode
	switch {
	case s >= 200 && s < 300:
		res.State = StateDelivered
		return res, true
	case s == http.StatusRequestTimeout || s == http.StatusConflict || s == http.StatusTooEarly || s == http.StatusTooManyRequests || s >= 500:
		res.State = StatePending
		res.Reason = fmt.Sprintf("outcome unknown: %d %s", s, http.StatusText(s))
		if ra, ok := retryAfter(resp.Header.Get("Retry-After"), now); ok {
			res.RetryIn = min(ra, time.Duration(e.KeyRetention))
		}
		// 409 is the receiver saying our key is in flight there: it is
		// healthy.
		return res, s == http.StatusConflict
	case s >= 300 && s < 400:
		res.State = StateDead
		res.Reason = fmt.Sprintf("%d %s: redirect to %q not followed (configure the endpoint's final URL)", s, http.StatusText(s), truncate(resp.Header.Get("Location"), 200))
		return res, true
	case s >= 400 && s < 500:
		res.State = StateDead
		res.Reason = fmt.Sprintf("refused: %d %s", s, http.StatusText(s))
		return res, true
	}
	if rerr != nil {
		res.Reason = "outcome unknown: reading the answer: " + rerr.Error()
	} else {
		res.Reason = fmt.Sprintf("outcome unknown: status %d", s)
	}
	res.State = StatePending
	return res, false
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// retryAfter parses a Retry-After value: seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, 1<<32)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// The Standard Webhooks headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Sign returns the webhook-signature value for a message: one
// "v1,<base64 HMAC-SHA256 of id.timestamp.payload>" per secret, separated
// by spaces, as the Standard Webhooks spec has it.
func Sign(secrets [][]byte, id string, ts time.Time, payload []byte) string {
	var b strings.Builder
	prefix := id + "." + strconv.FormatInt(ts.Unix(), 10) + "."
	for i, s := range secrets {
		h := hmac.New(sha256.New, s)
		h.Write([]byte(prefix))
		h.Write(payload)
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(base64.StdEncoding.EncodeToString(h.Sum(nil)))
	}
	return b.String()
}
