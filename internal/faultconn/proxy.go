package faultconn

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy is a TCP proxy on loopback that can be cut and mended: a link
// between two servers (a NATS route) that a test takes down. Cut closes
// the listener and every connection through it, both sides, so the peers
// see the link reset and cannot reconnect until Mend listens again on the
// same address.
//
// (toxiproxy does the same, but leaves a goroutine behind for every link
// whose write side failed, which the project's leak checks catch.)
type Proxy struct {
	addr     string
	upstream string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy listens on listen (host:port; port 0 picks a free one) and
// forwards every connection to upstream.
func NewProxy(listen, upstream string) (*Proxy, error) {
	p := &Proxy{addr: listen, upstream: upstream, conns: map[net.Conn]struct{}{}}
	if err := p.Mend(); err != nil {
		return nil, err
	}
	return p, nil
}

// Addr is the address the proxy listens on, stable across Cut and Mend.
func (p *Proxy) Addr() string { return p.addr }

// Mend listens again (a no-op while listening).
func (p *Proxy) Mend() error {
	p.mu.Lock()
	defer p.mu.Unlock()
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
		go p.pipe(up, down)
		go p.pipe(down, up)
	}
}

// pipe copies from src to dst; when either side ends, both close.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src) // an error is how a cut link ends
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
