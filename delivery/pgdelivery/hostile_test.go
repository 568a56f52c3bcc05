package pgdelivery_test

import (
	"context"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/internal/deliverytest"
)

// Hostile receivers hold one slot for one timeout and no memory: one that
// never answers, one that answers byte by byte, one that sends a gigabyte,
// and a redirect to another host, which is not followed.
func TestHostileReceivers(t *testing.T) {
	st, pool := newStore(t)
	stop := make(chan struct{})
	silent := deliverytest.NewReceiver(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	})
	drip := dripServer(t, stop)
	var sentBig atomic.Int64
	huge := deliverytest.NewReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		chunk := make([]byte, 1<<20)
		for i := 0; i < 1024; i++ { // a gigabyte, if anyone reads it
			n, err := w.Write(chunk)
			sentBig.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	var elsewhere atomic.Int64
	other := deliverytest.NewReceiver(t, func(int, http.ResponseWriter, *http.Request) { elsewhere.Add(1) })
	redirect := deliverytest.NewReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/steal", http.StatusTemporaryRedirect)
	})
	t.Cleanup(func() { close(stop) })

	eps := []delivery.Endpoint{deliverytest.Endpoint("silent", silent.URL), deliverytest.Endpoint("drip", drip), deliverytest.Endpoint("huge", huge.URL), deliverytest.Endpoint("redirect", redirect.URL)}
	for i := range eps[:3] {
		eps[i].Timeout = delivery.Duration(300 * time.Millisecond)
		eps[i].KeyRetention = delivery.Duration(900 * time.Millisecond)
	}
	for _, e := range eps {
		add(t, pool, e.Name, "m", 1)
	}
	var before, after runtimeMem
	before.read()
	deliverytest.Dispatch(t, st, delivery.Config{Endpoints: eps, Breaker: delivery.BreakerConfig{Failures: 1000}})
	for _, name := range []string{"silent", "drip", "huge"} {
		rows := deliverytest.WaitState(t, st, name, delivery.StateDead, 1)
		if !strings.Contains(rows[0].Reason, "outcome unknown: reconcile") {
			t.Errorf("%s: reason %q", name, rows[0].Reason)
		}
		if len(rows[0].LastBody) > 1024 {
			t.Errorf("%s: recorded %d bytes of body, want at most 1024", name, len(rows[0].LastBody))
		}
	}
	after.read()
	if grown := int64(after.heap) - int64(before.heap); grown > 64<<20 {
		t.Errorf("heap grew by %d MiB while a receiver sent up to a gigabyte", grown>>20)
	}
	if n := sentBig.Load(); n > 256<<20 {
		t.Errorf("the huge receiver got %d MiB out: its body was read, not bounded", n>>20)
	}
	rows := deliverytest.WaitState(t, st, "redirect", delivery.StateDead, 1)
	if rows[0].LastStatus != http.StatusTemporaryRedirect || !strings.Contains(rows[0].Reason, "not followed") {
		t.Errorf("redirect: %d %q", rows[0].LastStatus, rows[0].Reason)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect's target host got %d requests: the redirect was followed", n)
	}
}

// TLS is verified: a receiver whose certificate no configured CA signed
// gets no payload; with its CA in ca_file it gets it.
func TestTLSVerifiedByDefault(t *testing.T) {
	st, pool := newStore(t)
	var got atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { got.Add(1) }))
	srv.Config.ErrorLog = nil
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	untrusted := deliverytest.Endpoint("untrusted", srv.URL)
	trusted := deliverytest.Endpoint("trusted", srv.URL)
	trusted.CAFile = ca
	add(t, pool, "untrusted", "m", 1)
	deliverytest.Dispatch(t, st, delivery.Config{Endpoints: []delivery.Endpoint{untrusted, trusted}})
	// The attempt fails on the certificate and is kept for a retry (the
	// outcome of a refused handshake is recorded like any failed call).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rows, err := st.List(context.Background(), delivery.StatePending, "untrusted", 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 1 && strings.Contains(rows[0].Reason, "certificate") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes no attempt failed on the certificate: %+v", rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got.Load() != 0 {
		t.Fatalf("a receiver with an unverified certificate got %d requests", got.Load())
	}
	add(t, pool, "trusted", "m", 1)
	deliverytest.WaitState(t, st, "trusted", delivery.StateDelivered, 1)
}

// One hung endpoint holds only its own slots: the others' rows are
// delivered while every call to it hangs.
func TestHungEndpointDoesNotHoldOthers(t *testing.T) {
	st, pool := newStore(t)
	stop := make(chan struct{})
	hung := deliverytest.NewReceiver(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	})
	fast := deliverytest.NewReceiver(t, func(int, http.ResponseWriter, *http.Request) {})
	h := deliverytest.Endpoint("hung", hung.URL)
	h.Timeout = delivery.Duration(30 * time.Second)
	add(t, pool, "hung", "m", 20)
	add(t, pool, "fast", "m", 200)
	ctx := context.Background()
	start := time.Now()
	deliverytest.Dispatch(t, st, delivery.Config{Endpoints: []delivery.Endpoint{h, deliverytest.Endpoint("fast", fast.URL)}})
	t.Cleanup(func() { close(stop) }) // before the dispatcher's cleanup waits for its calls
	deliverytest.WaitState(t, st, "fast", delivery.StateDelivered, 200)
	took := time.Since(start)
	pending, err := st.List(ctx, delivery.StatePending, "hung", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 20 {
		t.Errorf("hung endpoint: %d rows pending, want all 20 still in its hung calls or waiting", len(pending))
	}
	if n := len(hung.Seen()); n != 4 {
		t.Errorf("hung endpoint got %d calls at once, want its concurrency, 4", n)
	}
	t.Logf("200 deliveries to the healthy endpoint in %v while the other hung", took)
}

// dripServer answers every request byte by byte, 50 ms a byte, status
// line and headers included, until stop.
func dripServer(t *testing.T, stop <-chan struct{}) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				c.Read(buf) //nolint:errcheck // the request, as far as it came
				for _, b := range []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") {
					if _, err := c.Write([]byte{b}); err != nil {
						return
					}
					select {
					case <-time.After(50 * time.Millisecond):
					case <-stop:
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}
