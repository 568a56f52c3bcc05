package natsenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

// NATSOptions configures an embedded nats-server.
type NATSOptions struct {
	// StoreDir holds JetStream's file store. Default: a new temp dir, removed
	// by Close.
	StoreDir string
	// SyncAlways fsyncs every JetStream write (`sync_interval: always`), the
	// production setting. Default false (the server's 2-minute default).
	SyncAlways bool
	// Port to listen on. Default: a free port, kept across restarts.
	Port int
	// Configure, if set, may change the server options before each start
	// (TLS, auth, limits).
	Configure func(*server.Options)
}

// NATS is an embedded nats-server with JetStream that can be shut down and
// started again on the same port and store.
type NATS struct {
	opts    NATSOptions
	ownsDir bool

	mu  sync.Mutex
	srv *server.Server
}

// StartNATS starts an embedded nats-server with JetStream on loopback.
func StartNATS(opts NATSOptions) (*NATS, error) {
	n := &NATS{opts: opts}
	if n.opts.StoreDir == "" {
		d, err := os.MkdirTemp("", "jetinbox-nats-")
		if err != nil {
			return nil, fmt.Errorf("testenv: %w", err)
		}
		n.opts.StoreDir, n.ownsDir = d, true
	}
	if n.opts.Port == 0 {
		// Kept across restarts, so below the ephemeral range: see
		// testenv.FreeLoopbackPorts.
		ps, err := testenv.FreeLoopbackPorts(1)
		if err != nil {
			n.Close()
			return nil, err
		}
		n.opts.Port = ps[0]
	}
	if err := n.Start(); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// Start starts the server (again) on the same port and store.
func (n *NATS) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return errors.New("testenv: nats already running")
	}
	o := &server.Options{
		ServerName: "jetinbox-test",
		Host:       "127.0.0.1",
		Port:       n.opts.Port,
		JetStream:  true,
		StoreDir:   n.opts.StoreDir,
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: 1 << 20,
		// What streams may reserve, fixed: left unset, the server takes 75%
		// of the disk's free space, and the default limits of a few streams
		// (16 GiB each) then fail on a machine with a small disk although
		// these throwaway servers store little. Configure can lower it.
		JetStreamMaxStore: server.JetStreamMaxStoreDefault,
	}
	if n.opts.SyncAlways {
		o.SyncAlways = true
		o.SyncInterval = 2 * time.Minute
	}
	if n.opts.Configure != nil {
		n.opts.Configure(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		return fmt.Errorf("testenv: nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(startCeiling) {
		s.Shutdown()
		return fmt.Errorf("testenv: nats-server not ready after %v", startCeiling)
	}
	n.srv = s
	if n.opts.Port == -1 {
		n.opts.Port = s.Addr().(*net.TCPAddr).Port
	}
	return nil
}

// Shutdown stops the server, keeping its store for a later Start.
func (n *NATS) Shutdown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// Restart shuts the server down and starts it again on the same port and
// store.
func (n *NATS) Restart() error {
	n.Shutdown()
	return n.Start()
}

// Close shuts the server down and removes its store if it owns it.
func (n *NATS) Close() {
	n.Shutdown()
	if n.ownsDir {
		_ = os.RemoveAll(n.opts.StoreDir)
	}
}

// URL is the client URL, stable across restarts.
func (n *NATS) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.opts.Port) }

// Server returns the running server, or nil while it is shut down.
func (n *NATS) Server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// NewNATS starts an embedded server for one test and shuts it down when the
// test ends.
func NewNATS(t testing.TB, opts NATSOptions) *NATS {
	t.Helper()
	if opts.StoreDir == "" {
		opts.StoreDir = t.TempDir()
	}
	n, err := StartNATS(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}
