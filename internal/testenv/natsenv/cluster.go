package natsenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/faultconn"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// ClusterSize is the number of nodes a [Cluster] runs: the smallest that
// keeps an R3 stream writable with one node gone.
const ClusterSize = 3

// ClusterOptions configures an embedded three-node JetStream cluster.
type ClusterOptions struct {
	// StoreDir holds one store directory per node (node-1, node-2,
	// node-3). Default: a new temp dir, removed by Close.
	StoreDir string
	// SyncAlways fsyncs every JetStream write on every node
	// (`sync_interval: always`), the production setting.
	SyncAlways bool
	// Configure, if set, may change a node's options (node is 0, 1 or 2)
	// before each of its starts.
	Configure func(node int, o *server.Options)
}

// Cluster is three embedded nats-servers with JetStream, clustered over
// loopback routes. Every route runs through an in-process TCP proxy
// (faultconn.Proxy), one per ordered pair of nodes, so that a node can be cut
// off from the others (Partition) while its clients stay connected to it.
// Nodes can be stopped, started and restarted on the same ports and store;
// stream and consumer leaders can be asked to step down.
type Cluster struct {
	opts    ClusterOptions
	ownsDir bool
	// name is this cluster's own: a server of another test's cluster that
	// still dials a route port reused here is refused, not taken in.
	name string

	clientPorts [ClusterSize]int
	routePorts  [ClusterSize]int
	// sink accepts and drops every connection: every node advertises it
	// as its route address, so that a route learned by gossip leads
	// nowhere and every route runs through the proxies.
	sink net.Listener
	// proxies[i][j] carries node i's route to node j (nil for i == j).
	proxies [ClusterSize][ClusterSize]*faultconn.Proxy

	mu          sync.Mutex
	srv         [ClusterSize]*server.Server
	partitioned [ClusterSize]bool
	killed      [ClusterSize]bool // cut off by Kill, healed by Start
}

// StartCluster starts three clustered nodes on loopback and waits until
// JetStream's meta group has a leader. Client and route ports are chosen
// before the start and kept across restarts.
//
// The ports are free when chosen, but another process may take one before
// a node listens on it: a start that fails on a port in use is tried again
// with new ports, a few times.
func StartCluster(ctx context.Context, opts ClusterOptions) (*Cluster, error) {
	for attempt := 1; ; attempt++ {
		c, err := startCluster(ctx, opts)
		if err == nil || attempt == 3 || !errors.Is(err, syscall.EADDRINUSE) && !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
	}
}

func startCluster(ctx context.Context, opts ClusterOptions) (_ *Cluster, err error) {
	c := &Cluster{opts: opts, name: clusterName()}
	if c.opts.StoreDir == "" {
		d, err := os.MkdirTemp("", "jetinbox-cluster-")
		if err != nil {
			return nil, fmt.Errorf("testenv: %w", err)
		}
		c.opts.StoreDir, c.ownsDir = d, true
	}
	defer func() {
		if err != nil {
			c.Close() // what started so far; c itself is not returned
		}
	}()
	ports, err := testenv.FreeLoopbackPorts(2*ClusterSize + ClusterSize*(ClusterSize-1))
	if err != nil {
		return nil, err
	}
	copy(c.clientPorts[:], ports[:ClusterSize])
	copy(c.routePorts[:], ports[ClusterSize:2*ClusterSize])
	ports = ports[2*ClusterSize:]
	if c.sink, err = routeSink(); err != nil {
		return nil, err
	}
	for i := range ClusterSize {
		for j := range ClusterSize {
			if i == j {
				continue
			}
			p, err := faultconn.NewProxy(fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", c.routePorts[j]))
			if err != nil {
				return nil, fmt.Errorf("testenv: route proxy n%d → n%d: %w", i+1, j+1, err)
			}
			ports = ports[1:]
			c.proxies[i][j] = p
		}
	}
	// All three start at once: a node's JetStream waits for the others.
	errs := make(chan error, ClusterSize)
	for i := range ClusterSize {
		go func() { errs <- c.Start(i) }()
	}
	for range ClusterSize {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		return nil, err
	}
	if err := c.WaitMetaLeader(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// NewCluster starts a cluster for one test and closes it when the test ends.
func NewCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	if opts.StoreDir == "" {
		opts.StoreDir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), startCeiling)
	defer cancel()
	c, err := StartCluster(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Name is node i's server name: n1, n2, n3.
func (c *Cluster) Name(i int) string { return fmt.Sprintf("n%d", i+1) }

// Node returns the index of the node named name, or -1.
func (c *Cluster) Node(name string) int {
	for i := range ClusterSize {
		if c.Name(i) == name {
			return i
		}
	}
	return -1
}

// URL is node i's client URL, stable across restarts.
func (c *Cluster) URL(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.clientPorts[i]) }

// URLs lists the client URLs of all nodes, comma-separated, as
// nats.Connect takes them: a client reconnects to another node when its
// own goes away.
func (c *Cluster) URLs() string {
	us := make([]string, ClusterSize)
	for i := range us {
		us[i] = c.URL(i)
	}
	return strings.Join(us, ",")
}

// Server returns node i's running server, or nil while it is stopped.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.srv[i]
}

// Start starts node i (again) on its ports and store.
func (c *Cluster) Start(i int) error {
	c.mu.Lock()
	running := c.srv[i] != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("testenv: node %s already running", c.Name(i))
	}
	o := &server.Options{
		ServerName: c.Name(i),
		Host:       "127.0.0.1",
		Port:       c.clientPorts[i],
		JetStream:  true,
		StoreDir:   filepath.Join(c.opts.StoreDir, c.Name(i)),
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: 1 << 20,
		// What streams may reserve, fixed: left unset, the server takes 75%
		// of the disk's free space, and the default limits of a few streams
		// (16 GiB each) then fail on a machine with a small disk although
		// these throwaway servers store little. Configure can lower it.
		JetStreamMaxStore: server.JetStreamMaxStoreDefault,
		Cluster: server.ClusterOpts{
			Name: c.name,
			Host: "127.0.0.1",
			Port: c.routePorts[i],
			// Servers tell each other about the routes they know (gossip)
			// and connect to what they hear of; those routes would bypass
			// the proxies and a partition would leak. Each advertises the
			// sink instead, so only the configured routes connect.
			Advertise: c.sink.Addr().String(),
		},
	}
	for j := range ClusterSize {
		if j != i {
			u, _ := url.Parse("nats-route://" + c.proxies[i][j].Addr())
			o.Routes = append(o.Routes, u)
		}
	}
	if c.opts.SyncAlways {
		o.SyncAlways = true
		o.SyncInterval = 2 * time.Minute
	}
	if c.opts.Configure != nil {
		c.opts.Configure(i, o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		return fmt.Errorf("testenv: node %s: %w", c.Name(i), err)
	}
	if os.Getenv("JETINBOX_NATS_LOG") != "" {
		s.ConfigureLogger()
	}
	go s.Start()
	if !s.ReadyForConnections(startCeiling) {
		s.Shutdown()
		return fmt.Errorf("testenv: node %s not ready after %v (set JETINBOX_NATS_LOG=1 to see its log)", c.Name(i), startCeiling)
	}
	c.mu.Lock()
	c.srv[i] = s
	killed := c.killed[i]
	c.killed[i] = false
	c.mu.Unlock()
	if killed {
		return c.Heal(i)
	}
	return nil
}

// Stop shuts node i down, keeping its store for a later Start. Its
// clients lose their connection; the Raft groups it led elect a new
// leader among the other two.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	s := c.srv[i]
	c.srv[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Kill stops node i as a crash would: its routes are cut first, so it
// cannot hand the leaderships it holds to the others (Stop's shutdown
// does); they find it gone and elect among themselves after their
// election timeout. Its clients lose their connection. Its files are
// flushed as the kernel would flush a killed process's writes: what a
// power loss takes is out of reach in-process. Start brings it back with
// its routes.
func (c *Cluster) Kill(i int) {
	c.Partition(i)
	c.mu.Lock()
	c.killed[i] = true
	c.mu.Unlock()
	c.Stop(i)
}

// Restart stops node i and starts it again on the same ports and store.
func (c *Cluster) Restart(i int) error {
	c.Stop(i)
	return c.Start(i)
}

// Partition cuts node i off from the other two: the proxies of every
// route between it and them close their connections and refuse new ones
// (peers see the connection reset, as when a link goes down). Node i keeps
// running and keeps its clients: they talk to a minority.
func (c *Cluster) Partition(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partitioned[i] = true
	for j := range ClusterSize {
		if j != i {
			c.proxies[i][j].Cut()
			c.proxies[j][i].Cut()
		}
	}
}

// Heal reconnects node i to the other two (the routes reconnect on their
// own, within a second or so).
func (c *Cluster) Heal(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partitioned[i] = false
	var err error
	for j := range ClusterSize {
		if j == i || c.partitioned[j] {
			continue
		}
		for _, p := range []*faultconn.Proxy{c.proxies[i][j], c.proxies[j][i]} {
			if perr := p.Mend(); perr != nil {
				err = errors.Join(err, fmt.Errorf("testenv: heal n%d: %w", i+1, perr))
			}
		}
	}
	return err
}

// Close stops every node and proxy and removes the store if it owns it.
func (c *Cluster) Close() {
	for i := range ClusterSize {
		c.Stop(i)
	}
	for i := range ClusterSize {
		for j := range ClusterSize {
			if p := c.proxies[i][j]; p != nil {
				p.Close()
			}
		}
	}
	if c.sink != nil {
		c.sink.Close()
	}
	if c.ownsDir {
		_ = os.RemoveAll(c.opts.StoreDir)
	}
}

// WaitMetaLeader waits until a running node leads JetStream's meta group
// and every running node sees it: then streams can be created.
func (c *Cluster) WaitMetaLeader(ctx context.Context) error {
	return poll(ctx, "a JetStream meta leader", func() bool {
		leader, running := false, 0
		for i := range ClusterSize {
			s := c.Server(i)
			if s == nil {
				continue
			}
			running++
			if s.JetStreamIsLeader() {
				leader = true
			}
			if !s.JetStreamIsCurrent() {
				return false
			}
		}
		return leader && running > 0
	})
}

// StreamLeader returns the node leading stream (in the global account), or
// -1 while it has none.
func (c *Cluster) StreamLeader(stream string) int {
	for i := range ClusterSize {
		if s := c.Server(i); s != nil && s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return i
		}
	}
	return -1
}

// ConsumerLeader returns the node leading consumer, or -1 while it has none.
func (c *Cluster) ConsumerLeader(stream, consumer string) int {
	for i := range ClusterSize {
		if s := c.Server(i); s != nil && s.JetStreamIsConsumerLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream, consumer) {
			return i
		}
	}
	return -1
}

// WaitStreamLeader waits until stream has a leader and returns it.
func (c *Cluster) WaitStreamLeader(ctx context.Context, stream string) (int, error) {
	return waitLeader(ctx, "a leader of stream "+stream, func() int { return c.StreamLeader(stream) })
}

// WaitConsumerLeader waits until consumer has a leader and returns it.
func (c *Cluster) WaitConsumerLeader(ctx context.Context, stream, consumer string) (int, error) {
	return waitLeader(ctx, "a leader of consumer "+stream+"/"+consumer, func() int { return c.ConsumerLeader(stream, consumer) })
}

// routeSink listens on loopback and closes every connection it accepts:
// the route address every node of a test cluster advertises, so that a
// route learned by gossip leads nowhere and every route runs through the
// proxies.
func routeSink() (net.Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	return l, nil
}

// clusterName returns a cluster name no other test's cluster has.
func clusterName() string {
	return fmt.Sprintf("jetinbox-test-%08x", rand.Uint32())
}

// waitLeader polls leader until it names a node.
func waitLeader(ctx context.Context, what string, leader func() int) (int, error) {
	l := -1
	err := poll(ctx, what, func() bool { l = leader(); return l >= 0 })
	return l, err
}

// WaitStreamCurrent waits until stream has a leader and every replica on
// a running, unpartitioned node has caught up with it, as an operator
// waits before the next step of a rolling restart.
func (c *Cluster) WaitStreamCurrent(ctx context.Context, stream string) error {
	return poll(ctx, "every replica of stream "+stream+" to be current", func() bool {
		if c.StreamLeader(stream) < 0 {
			return false
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, s := range c.srv {
			if s == nil || c.partitioned[i] {
				continue
			}
			if !s.JetStreamIsStreamCurrent(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
				return false
			}
		}
		return true
	})
}

// WaitHealthy waits until every running node that is not cut off answers
// its health check (the /healthz an operator's probe asks) with ok: its
// JetStream is up and every stream and consumer it holds is current. A
// rolling restart waits for this before it takes the next node down.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return poll(ctx, "every node to be healthy", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, s := range c.srv {
			if s == nil || c.partitioned[i] {
				continue
			}
			if h := s.Healthz(nil); h == nil || h.Status != "ok" {
				return false
			}
		}
		return true
	})
}

// ReadWhenHealthy runs read, which reads streams, once every node is
// healthy, up to three times. Right after a fault a node may still be
// catching up, and a stream info or an ordered consumer placed on it can
// time out; a read judges nothing, so trying it again on the whole
// cluster hides no violation. again, if not nil, hears each failure that
// is tried again. On a nil cluster read runs once.
func (c *Cluster) ReadWhenHealthy(ctx context.Context, read func() error, again func(error)) error {
	if c == nil {
		return read()
	}
	return readWhenHealthy(ctx, c.WaitHealthy, read, again)
}

// readWhenHealthy is ReadWhenHealthy for both kinds of cluster.
func readWhenHealthy(ctx context.Context, waitHealthy func(context.Context) error, read func() error, again func(error)) error {
	for attempt := 1; ; attempt++ {
		hctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := waitHealthy(hctx)
		cancel()
		if err != nil {
			return err
		}
		if err = read(); err == nil || attempt == 3 || ctx.Err() != nil {
			return err
		}
		if again != nil {
			again(err)
		}
	}
}

// MoveStreamLeader asks stream's leader to step down until another node
// leads it (a step-down may end with the same node elected again, or be
// refused while a replica catches up) and returns both nodes.
func (c *Cluster) MoveStreamLeader(ctx context.Context, nc *nats.Conn, stream string) (from, to int, err error) {
	return moveLeader(ctx, c.Name, func() int { return c.StreamLeader(stream) }, func() error { return StepDownStream(ctx, nc, stream) })
}

// MoveConsumerLeader is MoveStreamLeader for a consumer.
func (c *Cluster) MoveConsumerLeader(ctx context.Context, nc *nats.Conn, stream, consumer string) (from, to int, err error) {
	return moveLeader(ctx, c.Name, func() int { return c.ConsumerLeader(stream, consumer) }, func() error { return StepDownConsumer(ctx, nc, stream, consumer) })
}

// moveLeader steps a leader down until another node leads, for both kinds
// of cluster; name names a node in the error.
func moveLeader(ctx context.Context, name func(int) string, leader func() int, stepDown func() error) (from, to int, err error) {
	if err := poll(ctx, "a leader", func() bool { from = leader(); return from >= 0 }); err != nil {
		return -1, -1, err
	}
	var last error
	for ctx.Err() == nil {
		if last = stepDown(); last == nil {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := poll(wctx, "another leader", func() bool { to = leader(); return to >= 0 && to != from })
			cancel()
			if err == nil {
				return from, to, nil
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	return from, -1, fmt.Errorf("testenv: leadership did not move from %s: %w (last step-down: %v)", name(from), ctx.Err(), last)
}

// StepDownStream asks stream's leader to hand leadership to another
// replica, as `nats stream cluster step-down` does, through the JetStream
// API ($JS.API.STREAM.LEADER.STEPDOWN.<stream>).
func StepDownStream(ctx context.Context, nc *nats.Conn, stream string) error {
	return stepDown(ctx, nc, "$JS.API.STREAM.LEADER.STEPDOWN."+stream)
}

// StepDownConsumer asks a consumer's leader to hand leadership to another
// replica ($JS.API.CONSUMER.LEADER.STEPDOWN.<stream>.<consumer>).
func StepDownConsumer(ctx context.Context, nc *nats.Conn, stream, consumer string) error {
	return stepDown(ctx, nc, "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+consumer)
}

func stepDown(ctx context.Context, nc *nats.Conn, subject string) error {
	return jsAPI(ctx, nc, subject, nil)
}

// jsAPI makes one JetStream API request and turns a refusal into an error.
func jsAPI(ctx context.Context, nc *nats.Conn, subject string, req []byte) error {
	m, err := nc.RequestWithContext(ctx, subject, req)
	if err != nil {
		return fmt.Errorf("testenv: %s: %w", subject, err)
	}
	var resp struct {
		Success bool `json:"success"`
		Error   *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("testenv: %s: %w", subject, err)
	}
	if !resp.Success {
		desc := "no success"
		if resp.Error != nil {
			desc = resp.Error.Description
		}
		return fmt.Errorf("testenv: %s: %s", subject, desc)
	}
	return nil
}

// CreateStream creates an R3 stream, retrying while the meta group is
// still placing peers (right after a start, a stream needs all three).
func CreateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	var s jetstream.Stream
	var last error
	err := poll(ctx, "stream "+cfg.Name+" to be created", func() bool {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, last = js.CreateOrUpdateStream(actx, cfg)
		return last == nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w (last error: %v)", err, last)
	}
	return s, nil
}

// CreateConsumer creates or updates a consumer, each attempt bounded to a
// few seconds and retried: an API request can go unanswered while a Raft
// group of a fresh or faulted cluster elects its leader.
func CreateConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	var cons jetstream.Consumer
	var last error
	err := poll(ctx, "consumer "+cfg.Durable+" on "+stream+" to be created", func() bool {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		cons, last = js.CreateOrUpdateConsumer(actx, stream, cfg)
		return last == nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w (last error: %v)", err, last)
	}
	return cons, nil
}

// poll checks ok every 50ms until it holds or ctx ends.
// startCeiling bounds a server's start: a ceiling, not a pace (a start
// returns once the server takes connections). A node restarted on its
// JetStream store under the suite's -race load on two cores took longer
// than 30 s to recover it (TestPublisherAcrossLeaderElections: "node n2
// not ready after 30s").
const startCeiling = 3 * time.Minute

func poll(ctx context.Context, what string, ok func() bool) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if ok() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}
