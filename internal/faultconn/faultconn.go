// Package faultconn cuts PostgreSQL connections at the moment that matters:
// while a COMMIT is on the wire. Wrap a pool's connections with
// Injector.AfterNetConnect (pgconn.Config.AfterNetConnect), arm a mode, and
// the next COMMIT either never reaches the server (it rolls back) or reaches
// it while the client never hears back (it commits). Either way the client
// sees a broken connection and cannot know which happened: the "outcome
// unknown" branch the inbox must never ack.
//
// Proxy cuts links between servers: a TCP proxy a test can take down and
// bring back, which is how the three-node cluster of internal/testenv
// partitions a node.
package faultconn

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// Mode says what the next COMMIT meets.
type Mode int

// The modes.
const (
	// Off passes everything through.
	Off Mode = iota
	// DropCommit closes the connection instead of sending the COMMIT: the
	// server rolls the transaction back.
	DropCommit
	// CutAfterCommit sends the COMMIT, lets the server answer it, and
	// loses the answer: the server committed, the client never learns it.
	CutAfterCommit
)

// ErrCut is the error a cut connection reports.
var ErrCut = errors.New("faultconn: connection cut during COMMIT")

// Injector arms faults on the connections it wrapped.
type Injector struct {
	mu    sync.Mutex
	mode  Mode
	fired int
}

// Arm makes the next COMMIT on any wrapped connection meet mode; it fires
// once.
func (i *Injector) Arm(m Mode) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.mode = m
}

// Fired returns how often a fault fired.
func (i *Injector) Fired() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.fired
}

func (i *Injector) take() Mode {
	i.mu.Lock()
	defer i.mu.Unlock()
	m := i.mode
	if m != Off {
		i.mode = Off
		i.fired++
	}
	return m
}

// AfterNetConnect wraps each new connection; use it as
// pgconn.Config.AfterNetConnect.
func (i *Injector) AfterNetConnect(_ context.Context, _ *pgconn.Config, c net.Conn) (net.Conn, error) {
	return &conn{Conn: c, inj: i}, nil
}

type conn struct {
	net.Conn
	inj        *Injector
	cut        bool
	loseAnswer bool
}

// commitMsg is the simple-protocol Query message pgx sends for Commit.
var commitMsg = append([]byte{'Q', 0, 0, 0, 11}, "commit\x00"...)

func (c *conn) Write(b []byte) (int, error) {
	if c.cut {
		return 0, ErrCut
	}
	if bytes.Contains(b, commitMsg) {
		switch c.inj.take() {
		case DropCommit:
			c.cut = true
			c.Conn.Close()
			return 0, ErrCut
		case CutAfterCommit:
			n, err := c.Conn.Write(b)
			c.loseAnswer = true
			return n, err
		}
	}
	return c.Conn.Write(b)
}

func (c *conn) Read(b []byte) (int, error) {
	if c.loseAnswer {
		// The server answered the COMMIT, so it committed; the answer is
		// lost on the wire and the connection dies.
		_, _ = c.Conn.Read(make([]byte, 512))
		c.loseAnswer, c.cut = false, true
	}
	if c.cut {
		c.Conn.Close()
		return 0, ErrCut
	}
	return c.Conn.Read(b)
}
