package faultconn

import (
	"bufio"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// recorder is an upstream that keeps every line it reads and the server
// side of every connection it accepted, so a test can write from the
// upstream too.
type recorder struct {
	ln    net.Listener
	mu    sync.Mutex
	lines []string
	conns []net.Conn
	wg    sync.WaitGroup
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns = append(r.conns, c)
			r.mu.Unlock()
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					r.mu.Lock()
					r.lines = append(r.lines, strings.TrimSpace(line))
					r.mu.Unlock()
				}
			}()
		}
	}()
	return r
}

func (r *recorder) seen() ([]string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...), len(r.conns)
}

// say writes a line from the upstream side of every connection.
func (r *recorder) say(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		_, _ = c.Write([]byte(line + "\n"))
	}
}

func (r *recorder) close() {
	r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// waitFor polls ok for up to a minute (the machine may be loaded).
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// quiet reads from c for d and says whether nothing arrived and the
// connection stayed open: a read that times out, not one that ends.
func quiet(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	b := make([]byte, 64)
	n, err := c.Read(b)
	switch {
	case n > 0:
		t.Errorf("%q arrived through the hole", b[:n])
	case errors.Is(err, os.ErrDeadlineExceeded):
	default:
		t.Errorf("the connection ended (%v): a black hole closes nothing", err)
	}
}

func has(lines []string, l string) bool {
	for _, x := range lines {
		if x == l {
			return true
		}
	}
	return false
}

// TestProxyBlackHole: a black-holed link takes every write and delivers
// nothing either way, closes nothing, and swallows new connections without
// reaching the upstream; a mend resets what it touched and lets new
// connections through again.
func TestProxyBlackHole(t *testing.T) {
	defer goleak.VerifyNone(t)
	up := newRecorder(t)
	defer up.close()
	p, err := NewProxy("127.0.0.1:0", up.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("before\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the line before the hole", func() bool { l, _ := up.seen(); return has(l, "before") })
	if err := p.BlackHole(); err != nil {
		t.Fatal(err)
	}
	// Far more than any socket buffer: the proxy reads it all, so every
	// write succeeds.
	chunk := []byte(strings.Repeat("x", 1023) + "\n")
	_ = c.SetWriteDeadline(time.Now().Add(time.Minute))
	for range 4096 {
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("a write into the black hole failed: %v", err)
		}
	}
	if _, err := c.Write([]byte("during\n")); err != nil {
		t.Fatal(err)
	}
	up.say("from-upstream")
	// A new connection is accepted and takes writes, and never reaches
	// the upstream.
	_, conns := up.seen()
	c2, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatalf("the black hole refused a connection: %v", err)
	}
	defer c2.Close()
	if _, err := c2.Write([]byte("new-during\n")); err != nil {
		t.Fatalf("a write on a new connection into the black hole failed: %v", err)
	}
	quiet(t, c, 500*time.Millisecond)
	quiet(t, c2, 100*time.Millisecond)
	lines, conns2 := up.seen()
	if len(lines) != 1 || conns2 != conns {
		t.Errorf("the upstream got %d lines (want only the one before) and %d new connections (want 0)", len(lines), conns2-conns)
	}
	if err := p.Mend(); err != nil {
		t.Fatal(err)
	}
	// What the hole touched is reset: its byte stream has a gap.
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := c.Read(make([]byte, 64)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("after the mend the holed connection read %v, want it closed", err)
	}
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if _, err := c3.Write([]byte("after\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the line after the mend", func() bool { l, _ := up.seen(); return has(l, "after") })
	c.Close()
	c2.Close()
	c3.Close()
	p.Close()
	up.close()
}

// TestProxyOneWay: dropping one direction leaves the other flowing, and
// the connection open: with DropToUpstream the upstream stops hearing the
// dialer and the dialer still hears the upstream; DropFromUpstream is the
// reverse.
func TestProxyOneWay(t *testing.T) {
	defer goleak.VerifyNone(t)
	up := newRecorder(t)
	defer up.close()
	p, err := NewProxy("127.0.0.1:0", up.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	hears := func(want string) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		line, err := br.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != want {
			t.Fatalf("the dialer read %q, %v; want %q", line, err, want)
		}
	}
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first line", func() bool { l, _ := up.seen(); return has(l, "hello") })

	p.DropToUpstream()
	if _, err := c.Write([]byte("unheard\n")); err != nil {
		t.Fatalf("write toward the deaf side: %v", err)
	}
	up.say("heard-by-dialer")
	hears("heard-by-dialer")
	if l, _ := up.seen(); has(l, "unheard") {
		t.Error("the upstream heard the dialer through a cut toward it")
	}
	if err := p.Mend(); err != nil {
		t.Fatal(err)
	}

	// The mend reset that connection: dial again for the other direction.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.Write([]byte("second\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second connection's line", func() bool { l, _ := up.seen(); return has(l, "second") })
	p.DropFromUpstream()
	up.say("unheard-by-dialer")
	if _, err := c2.Write([]byte("heard-by-upstream\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the dialer's line through a cut from the upstream", func() bool { l, _ := up.seen(); return has(l, "heard-by-upstream") })
	quiet(t, c2, 300*time.Millisecond)
	c.Close()
	c2.Close()
	p.Close()
	up.close()
}
