package faultconn

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// Proxy is a TCP proxy on loopback that can be cut and mended: a link
// between two servers (a NATS route) or between a client and its server
// that a test takes down. Cut closes the listener and every connection
// through it, both sides, so the peers see the link reset and cannot
// reconnect until Mend listens again on the same address. BlackHole drops
// every byte and closes nothing; DropToUpstream and DropFromUpstream drop
// one direction only (a one-way cut: one side hears the other, not the
// reverse).
//
// (toxiproxy does the same, but leaves a goroutine behind for every link
// whose write side failed, which the project's leak checks catch.)
type Proxy struct {
	addr     string
	upstream string

	// dropUp and dropDown drop the bytes flowing toward the upstream and
	// back from it (BlackHole, DropToUpstream, DropFromUpstream).
	dropUp, dropDown atomic.Bool

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	// holed are the connections a drop touched: accepted while dropping
	// (never dialed upstream), or with bytes dropped. Mend closes them.
	holed map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy listens on listen (host:port; port 0 picks a free one) and
// forwards every connection to upstream.
func NewProxy(listen, upstream string) (*Proxy, error) {
	p := &Proxy{addr: listen, upstream: upstream, conns: map[net.Conn]struct{}{}, holed: map[net.Conn]struct{}{}}
	if err := p.Mend(); err != nil {
		return nil, err
	}
	return p, nil
}

// Addr is the address the proxy listens on, stable across Cut and Mend.
func (p *Proxy) Addr() string { return p.addr }

// Mend listens again (a no-op while listening) and ends a black hole or
// a one-way cut: bytes flow both ways again, and every connection the
// drop touched is closed, since a byte stream with a hole in it cannot go
// on (as TCP gives up on a connection whose packets went unanswered too
// long); the peers dial again.
func (p *Proxy) Mend() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropUp.Store(false)
	p.dropDown.Store(false)
	for c := range p.holed {
		c.Close()
	}
	clear(p.holed)
	return p.listenLocked()
}

func (p *Proxy) listenLocked() error {
	if p.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("faultconn: proxy listen %s: %w", p.addr, err)
	}
	p.ln, p.addr = ln, ln.Addr().String()
	p.wg.Add(1)
	go p.accept(ln)
	return nil
}

// BlackHole drops every byte in both directions without closing anything:
// the connections through the proxy stay open and every write on them
// succeeds, but nothing arrives; new connections are accepted and read,
// and never reach the upstream. The peers learn of it only from their own
// timeouts (a ping unanswered, a write deadline, a Raft heartbeat
// missing). Mend ends it. A cut proxy starts listening again.
func (p *Proxy) BlackHole() error {
	p.dropUp.Store(true)
	p.dropDown.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.listenLocked()
}

// DropToUpstream is half a black hole: what the dialing side sends is
// dropped, what the upstream sends still arrives. The upstream no longer
// hears the dialer; the dialer still hears it. Mend ends it.
func (p *Proxy) DropToUpstream() {
	p.dropUp.Store(true)
}

// DropFromUpstream is the other half: the dialer no longer hears the
// upstream; the upstream still hears the dialer. Mend ends it.
func (p *Proxy) DropFromUpstream() {
	p.dropDown.Store(true)
}

// Cut stops listening and closes every connection through the proxy, and
// returns once all its goroutines have ended.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.holed)
	p.mu.Unlock()
	p.wg.Wait()
}

// Close is Cut.
func (p *Proxy) Close() { p.Cut() }

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		down, err := ln.Accept()
		if err != nil {
			return // closed by Cut
		}
		if p.dropUp.Load() || p.dropDown.Load() {
			// Nothing of this connection reaches the upstream, nor would
			// its handshake: it is accepted and read, and left open.
			p.mu.Lock()
			if p.ln != ln {
				p.mu.Unlock()
				down.Close()
				continue
			}
			p.conns[down], p.holed[down] = struct{}{}, struct{}{}
			p.wg.Add(1)
			p.mu.Unlock()
			go p.pipe(nil, down, true)
			continue
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		if p.ln != ln { // cut while dialing
			p.mu.Unlock()
			down.Close()
			up.Close()
			continue
		}
		p.conns[down], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(up, down, true)
		go p.pipe(down, up, false)
	}
}

// pipe copies from src to dst, toward the upstream if up; while that
// direction drops, what it reads goes nowhere (dst nil: always). When
// either side ends, both close.
func (p *Proxy) pipe(dst, src net.Conn, up bool) {
	defer p.wg.Done()
	drop := &p.dropDown
	if up {
		drop = &p.dropUp
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if dst == nil || drop.Load() {
				p.touched(src, dst)
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break // a cut link ends here too
		}
	}
	if dst != nil {
		dst.Close()
	}
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	delete(p.holed, dst)
	delete(p.holed, src)
	p.mu.Unlock()
}

// touched marks a connection pair that lost bytes.
func (p *Proxy) touched(a, b net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.conns[a]; ok {
		p.holed[a] = struct{}{}
	}
	if _, ok := p.conns[b]; b != nil && ok {
		p.holed[b] = struct{}{}
	}
}
