package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/jitter"
)

// scripted answers the n-th request (1-based) with script(n) and records
// the keys it was sent.
func scripted(t *testing.T, script func(n int64, w http.ResponseWriter)) (*httptest.Server, *[]string) {
	var n atomic.Int64
	var mu sync.Mutex
	keys := &[]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*keys = append(*keys, r.Header.Get(idempotency.Header))
		mu.Unlock()
		script(n.Add(1), w)
	}))
	t.Cleanup(srv.Close)
	return srv, keys
}

func fast(attempts int) jitter.Policy {
	return jitter.Policy{Kind: jitter.Full, Base: time.Millisecond, Cap: 5 * time.Millisecond, MaxAttempts: attempts}
}

func TestClientRetriesWithOneKey(t *testing.T) {
	srv, keys := scripted(t, func(n int64, w http.ResponseWriter) {
		switch n {
		case 1: // the answer is lost: the connection closes without one
			hj, _ := w.(http.Hijacker)
			c, _, _ := hj.Hijack()
			c.Close()
		case 2:
			time.Sleep(300 * time.Millisecond) // longer than the client waits
		case 3:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
		case 4:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.Header().Set(idempotency.ReplayedHeader, "true")
			w.WriteHeader(http.StatusAccepted)
			w.Write([]byte("ok"))
		}
	})
	c := &idempotency.Client{Policy: fast(10), Timeout: 100 * time.Millisecond}
	key := idempotency.NewKey()
	start := time.Now()
	res, err := c.Do(context.Background(), idempotency.Request{URL: srv.URL, Body: []byte("x"), Key: key})
	if err != nil || res.Status != http.StatusAccepted || !res.Replayed || res.Attempts != 5 || string(res.Body) != "ok" {
		t.Fatalf("%+v %v", res, err)
	}
	if time.Since(start) < time.Second {
		t.Fatalf("finished in %v: the 409's Retry-After of 1 s was not honoured", time.Since(start))
	}
	for i, k := range *keys {
		if k != `"`+key+`"` {
			t.Fatalf("attempt %d sent key %s, want %q", i+1, k, key)
		}
	}
}

func TestClientDoesNotRetryOther4xx(t *testing.T) {
	for _, status := range []int{400, 401, 404, 413, 422} {
		srv, keys := scripted(t, func(n int64, w http.ResponseWriter) { w.WriteHeader(status) })
		c := &idempotency.Client{Policy: fast(5)}
		res, err := c.Do(context.Background(), idempotency.Request{URL: srv.URL, Key: "k"})
		if err != nil || res.Status != status || len(*keys) != 1 {
			t.Errorf("%d: %+v %v after %d requests, want the answer after one", status, res, err, len(*keys))
		}
	}
}

func TestClientSaysOutcomeUnknown(t *testing.T) {
	srv, keys := scripted(t, func(n int64, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	c := &idempotency.Client{Policy: fast(2)}
	res, err := c.Do(context.Background(), idempotency.Request{URL: srv.URL, Key: "k"})
	if !errors.Is(err, idempotency.ErrOutcomeUnknown) || res == nil || res.Status != 503 || len(*keys) != 3 {
		t.Fatalf("%+v %v after %d requests; want outcome unknown after 3", res, err, len(*keys))
	}
	srv.Close()
	_, err = c.Do(context.Background(), idempotency.Request{URL: srv.URL, Key: "k"})
	if !errors.Is(err, idempotency.ErrOutcomeUnknown) {
		t.Fatalf("no server: %v", err)
	}
	if _, err := c.Do(context.Background(), idempotency.Request{URL: srv.URL, Key: "bad key"}); !errors.Is(err, idempotency.ErrBadKey) {
		t.Fatalf("bad key: %v", err)
	}
}

func TestParseKeyForms(t *testing.T) {
	for in, want := range map[string]string{`"abc"`: "abc", "abc": "abc", ` "a-b_c.d:e~f+g/h=" `: "a-b_c.d:e~f+g/h=", `"a\\b"`: ""} {
		got, err := idempotency.ParseKey(in)
		if want == "" {
			if err == nil {
				t.Errorf("ParseKey(%s) = %q, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("ParseKey(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	a := idempotency.Scope{Principal: "ab", Method: "POST", Route: "/r", Key: "k"}
	b := idempotency.Scope{Principal: "a", Method: "bPOST", Route: "/r", Key: "k"}
	if a.Hash() == b.Hash() || a.ID() == b.ID() {
		t.Fatal("moving a byte between the principal and the method gives the same scope")
	}
}
