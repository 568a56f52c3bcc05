package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/jetinbox/jetinbox/jitter"
)

// ErrOutcomeUnknown is returned by [Client.Do] when it gave up without a
// terminal answer: the request may or may not have been applied. Retry it
// later with the same key (inside the server's retention), which replays
// the answer if it was, or look its state up.
var ErrOutcomeUnknown = errors.New("idempotency: outcome unknown")

// NewKey returns a fresh key: 128 random bits in hex, one per intent.
// Keep it with the intent and send it on every retry.
func NewKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// Client sends requests with an Idempotency-Key and retries them with the
// same key: after a transport error or timeout (no answer), after 409
// (the first request is still in flight), and after 408, 429 and 5xx,
// waiting Retry-After when the server sends one and the policy's jittered
// delay otherwise. It never retries any other 4xx: they are the answer.
type Client struct {
	// HTTP sends the requests. Default http.DefaultClient.
	HTTP *http.Client
	// Policy spaces the retries and bounds them; its zero fields take
	// jitter's defaults (decorrelated, 100 ms to 10 s), and without
	// MaxAttempts or MaxElapsed it stops after 10 retries.
	Policy jitter.Policy
	// Timeout bounds each attempt; 0: none of its own.
	Timeout time.Duration
	// MaxRetryAfter caps a server's Retry-After. Default 30 s.
	MaxRetryAfter time.Duration
}

// Request is one intent to send. Key is required ([NewKey]): the same key
// for every retry of the intent, also across restarts of the client.
type Request struct {
	Method, URL string
	Header      http.Header
	Body        []byte
	Key         string
}

// Result is a terminal answer.
type Result struct {
	Status int
	Header http.Header
	Body   []byte
	// Replayed: the server sent the stored answer of an earlier attempt.
	Replayed bool
	// Attempts is how many requests were sent.
	Attempts int
}

// Do sends req until it gets a terminal answer (2xx, 3xx, a 4xx other
// than 408, 409 and 429), and returns it; any 4xx is returned as a Result
// with a nil error. When the policy's retries run out, or ctx ends, before
// such an answer, the error wraps [ErrOutcomeUnknown] (and the Result, if
// any, is the last transient answer).
func (c *Client) Do(ctx context.Context, req Request) (*Result, error) {
	if err := ValidateKey(req.Key); err != nil {
		return nil, err
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	policy := c.Policy
	if policy.MaxAttempts == 0 && policy.MaxElapsed == 0 {
		policy.MaxAttempts = jitter.Default().MaxAttempts // never retry without end
	}
	maxRA := c.MaxRetryAfter
	if maxRA <= 0 {
		maxRA = 30 * time.Second
	}
	bo := policy.NewBackOff()
	var last *Result
	var lastErr error
	for attempt := 1; ; attempt++ {
		res, err := c.once(ctx, hc, req)
		if res != nil {
			res.Attempts = attempt
		}
		if err == nil && !retryStatus(res.Status) {
			return res, nil
		}
		last, lastErr = res, err
		if ctx.Err() != nil {
			return last, fmt.Errorf("%w after %d attempts: %w", ErrOutcomeUnknown, attempt, ctx.Err())
		}
		d := bo.NextBackOff()
		if d == backoff.Stop {
			if err == nil {
				err = fmt.Errorf("last answer %d", res.Status)
			}
			return last, fmt.Errorf("%w after %d attempts: %w", ErrOutcomeUnknown, attempt, err)
		}
		if res != nil {
			if ra, ok := retryAfter(res.Header.Get("Retry-After")); ok {
				d = max(d, min(ra, maxRA))
			}
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			if lastErr == nil {
				lastErr = fmt.Errorf("last answer %d", last.Status)
			}
			return last, fmt.Errorf("%w after %d attempts: %w (%w)", ErrOutcomeUnknown, attempt, ctx.Err(), lastErr)
		case <-t.C:
		}
	}
}

func (c *Client) once(ctx context.Context, hc *http.Client, req Request) (*Result, error) {
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	method := req.Method
	if method == "" {
		method = http.MethodPost
	}
	hr, err := http.NewRequestWithContext(ctx, method, req.URL, bytes.NewReader(req.Body))
	if err != nil {
		return nil, err
	}
	for k, v := range req.Header {
		hr.Header[k] = v
	}
	hr.Header.Set(Header, FormatKey(req.Key))
	resp, err := hc.Do(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err // the answer was cut off: as if there was none
	}
	return &Result{Status: resp.StatusCode, Header: resp.Header, Body: body, Replayed: resp.Header.Get(ReplayedHeader) == "true"}, nil
}

// retryStatus: the answers that are not the request's outcome.
func retryStatus(status int) bool {
	return status == http.StatusConflict || !Terminal(status)
}

// retryAfter reads a Retry-After of seconds or an HTTP date.
func retryAfter(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}
