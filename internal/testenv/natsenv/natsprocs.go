package natsenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetinbox/jetinbox/internal/faultconn"
	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// NATSProcsOptions configures nats-servers that run as child processes.
type NATSProcsOptions struct {
	// Nodes is 1 (a single server) or 3 (a cluster whose routes run
	// through faultconn proxies, as [Cluster]'s do). Default 1.
	Nodes int
	// StoreDirs holds one JetStream store directory per node (one may lie
	// on a filesystem that models power loss). Default: temp dirs, removed
	// by Close. Nodes added later get a temp dir.
	StoreDirs []string
	// SyncInterval is the JetStream sync_interval: "always" (the shipped
	// setting, every write fsynced) or "" (nats-server's default, two
	// minutes), or a duration such as "10s".
	SyncInterval string
	// ClientProxies puts a faultconn proxy in front of each node's client
	// port (URL names it, and the node advertises it to clients), so that
	// BlackHole reaches the node's clients too.
	ClientProxies bool
	// SystemAccount adds a system account user (SysURL), for the
	// system-only JetStream API such as $JS.API.SERVER.REMOVE; clients
	// without credentials stay in the global account.
	SystemAccount bool
	// Logf, if set, gets a line per start, stop, signal and partition,
	// and, with JETINBOX_NATS_LOG set, every line the servers log. Log
	// returns a node's last lines in any case.
	Logf func(format string, a ...any)
}

// NATSProcs is one or more nats-servers, each a child process running this
// binary in the [subproc.RoleNATSServer] role, so that faults only a process
// suffers reach them: SIGKILL (the kernel keeps the page cache, so what was
// written survives), SIGSTOP and SIGCONT, and, with the store on a
// filesystem that models it, a power loss. Each node keeps its ports,
// configuration file and store across restarts; cluster routes run through
// proxies, one per ordered pair of nodes, to partition a node. Leaders and
// health are read from each node's monitoring port.
//
// The binary must register the role: subproc.Dispatch in main, or in
// TestMain for a test binary.
type NATSProcs struct {
	o       NATSProcsOptions
	dir     string // configuration files and default stores
	cluster bool
	// sink accepts and drops every connection: every node advertises it as
	// its route address, so that a route learned by gossip leads nowhere
	// and every route runs through the proxies (see [Cluster]).
	sink net.Listener
	// name is the cluster's name, its own (see [Cluster]).
	name string

	mu    sync.Mutex
	nodes []*procNode
	// proxies[[2]int{i, j}] carries node i's route to node j.
	proxies map[[2]int]*faultconn.Proxy
}

// procNode is one server of a NATSProcs.
type procNode struct {
	name                        string
	clientPort, routePort, http int
	storeDir, conf              string
	log                         *testenv.LogTail

	// clientProxy fronts the client port (ClientProxies), else nil.
	clientProxy *faultconn.Proxy

	cmd         *exec.Cmd
	done        chan struct{} // closed when cmd exited
	paused      bool
	partitioned bool
}

// StartNATSProcs starts the servers and, for a cluster, waits until
// JetStream's meta group has a leader. A start that fails on a port taken
// meanwhile by another process is tried again with new ports, a few times.
func StartNATSProcs(ctx context.Context, o NATSProcsOptions) (*NATSProcs, error) {
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Nodes != 1 && o.Nodes != 3 {
		return nil, fmt.Errorf("testenv: NATSProcs runs 1 or 3 nodes, not %d", o.Nodes)
	}
	if len(o.StoreDirs) != 0 && len(o.StoreDirs) != o.Nodes {
		return nil, fmt.Errorf("testenv: %d store dirs for %d nodes", len(o.StoreDirs), o.Nodes)
	}
	switch o.SyncInterval {
	case "", "always":
	default:
		if _, err := time.ParseDuration(o.SyncInterval); err != nil {
			return nil, fmt.Errorf("testenv: sync interval %q: want \"always\", \"\" or a duration", o.SyncInterval)
		}
	}
	for attempt := 1; ; attempt++ {
		c, err := startNATSProcs(ctx, o)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
	}
}

func startNATSProcs(ctx context.Context, o NATSProcsOptions) (_ *NATSProcs, err error) {
	c := &NATSProcs{o: o, cluster: o.Nodes > 1, name: clusterName(), proxies: map[[2]int]*faultconn.Proxy{}}
	if c.dir, err = os.MkdirTemp("", "jetinbox-natsprocs-"); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.cluster {
		if c.sink, err = routeSink(); err != nil {
			return nil, err
		}
	}
	for i := range o.Nodes {
		store := ""
		if len(o.StoreDirs) > 0 {
			store = o.StoreDirs[i]
		}
		if err := c.addNode(store); err != nil {
			return nil, err
		}
	}
	// All start at once: a node's JetStream waits for the others.
	errs := make(chan error, o.Nodes)
	for i := range o.Nodes {
		go func() { errs <- c.Start(i) }()
	}
	for range o.Nodes {
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

// addNode allocates ports, a store and, in a cluster, the route proxies
// between the new node and every other one. It starts nothing.
func (c *NATSProcs) addNode(store string) error {
	ports, err := testenv.FreeLoopbackPorts(3)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i := len(c.nodes)
	n := &procNode{name: fmt.Sprintf("n%d", i+1), clientPort: ports[0], routePort: ports[1], http: ports[2], storeDir: store, log: testenv.NewLogTail(200)}
	if n.storeDir == "" {
		n.storeDir = filepath.Join(c.dir, n.name)
	}
	n.conf = filepath.Join(c.dir, n.name+".conf")
	if c.o.ClientProxies {
		p, err := faultconn.NewProxy("127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", n.clientPort))
		if err != nil {
			return fmt.Errorf("testenv: client proxy of %s: %w", n.name, err)
		}
		n.clientProxy = p
	}
	if c.cluster {
		for j, m := range c.nodes {
			for _, pair := range [][2]int{{i, j}, {j, i}} {
				to := m.routePort
				if pair[1] == i {
					to = n.routePort
				}
				p, err := faultconn.NewProxy("127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", to))
				if err != nil {
					return fmt.Errorf("testenv: route proxy n%d → n%d: %w", pair[0]+1, pair[1]+1, err)
				}
				c.proxies[pair] = p
			}
		}
	}
	c.nodes = append(c.nodes, n)
	return nil
}

// NewNATSProcs starts servers for one test and stops them when it ends.
func NewNATSProcs(t testing.TB, o NATSProcsOptions) *NATSProcs {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := StartNATSProcs(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func (c *NATSProcs) node(i int) *procNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.nodes) {
		return nil
	}
	return c.nodes[i]
}

// Size is the number of nodes, including added ones.
func (c *NATSProcs) Size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.nodes)
}

// Name is node i's server name: n1, n2, ...
func (c *NATSProcs) Name(i int) string { return fmt.Sprintf("n%d", i+1) }

// Node returns the index of the node named name, or -1.
func (c *NATSProcs) Node(name string) int {
	for i := range c.Size() {
		if c.Name(i) == name {
			return i
		}
	}
	return -1
}

// URL is node i's client URL, stable across restarts.
func (c *NATSProcs) URL(i int) string {
	n := c.node(i)
	if n.clientProxy != nil {
		return "nats://" + n.clientProxy.Addr()
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", n.clientPort)
}

// URLs lists the client URLs of the nodes started with the cluster,
// comma-separated, as nats.Connect takes them.
func (c *NATSProcs) URLs() string {
	us := make([]string, c.o.Nodes)
	for i := range us {
		us[i] = c.URL(i)
	}
	return strings.Join(us, ",")
}

// Pid is node i's process ID, or 0 while it is not running.
func (c *NATSProcs) Pid(i int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.nodes[i]; n.cmd != nil {
		return n.cmd.Process.Pid
	}
	return 0
}

// Running says whether node i's process runs (paused or not).
func (c *NATSProcs) Running(i int) bool { return c.Pid(i) != 0 }

// StoreDir is node i's JetStream store directory.
func (c *NATSProcs) StoreDir(i int) string { return c.node(i).storeDir }

// Log returns the last lines node i logged.
func (c *NATSProcs) Log(i int) string { return c.node(i).log.String() }

func (c *NATSProcs) logf(format string, a ...any) {
	if c.o.Logf != nil {
		c.o.Logf(format, a...)
	}
}

// writeConf writes node i's configuration, with a route to every other
// node through its proxy. Called by each Start: a node added since the
// last start is among its routes.
func (c *NATSProcs) writeConf(i int) error {
	c.mu.Lock()
	n := c.nodes[i]
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %s\nlisten: \"127.0.0.1:%d\"\nhttp: \"127.0.0.1:%d\"\nmax_payload: 1MB\n", n.name, n.clientPort, n.http)
	// max_file_store fixed: left unset, the server takes 75% of the disk's
	// free space, and a few streams' default limits fail on a small disk.
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n  max_file_store: %d\n", n.storeDir, server.JetStreamMaxStoreDefault)
	if c.o.SyncInterval != "" {
		fmt.Fprintf(&b, "  sync_interval: %q\n", c.o.SyncInterval)
	}
	b.WriteString("}\n")
	if n.clientProxy != nil {
		fmt.Fprintf(&b, "client_advertise: %q\n", n.clientProxy.Addr())
	}
	if c.o.SystemAccount {
		// Users in the global account and the system account's; a client
		// without credentials is the global account's user.
		fmt.Fprintf(&b, "authorization { users: [{user: %q, password: %q}] }\nno_auth_user: %q\n", appUser, appUser, appUser)
		fmt.Fprintf(&b, "accounts { SYS { users: [{user: %q, password: %q}] } }\nsystem_account: SYS\n", sysUser, sysUser)
	}
	if c.cluster {
		fmt.Fprintf(&b, "cluster {\n  name: %s\n  listen: \"127.0.0.1:%d\"\n  advertise: %q\n  routes: [\n", c.name, n.routePort, c.sink.Addr().String())
		for j := range c.nodes {
			if j != i {
				fmt.Fprintf(&b, "    \"nats-route://%s\"\n", c.proxies[[2]int{i, j}].Addr())
			}
		}
		b.WriteString("  ]\n}\n")
	}
	c.mu.Unlock()
	if err := os.WriteFile(n.conf, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
}

// Start starts node i (again) on its ports, configuration and store, after
// Kill or Stop, and waits until it accepts clients.
func (c *NATSProcs) Start(i int) error {
	n := c.node(i)
	if n == nil {
		return fmt.Errorf("testenv: no node %d", i)
	}
	if c.Running(i) {
		return fmt.Errorf("testenv: node %s already running", n.name)
	}
	if err := c.writeConf(i); err != nil {
		return err
	}
	cmd, err := subproc.Command(context.Background(), subproc.RoleNATSServer, "-c", n.conf)
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	var out io.Writer = n.log
	if c.o.Logf != nil && os.Getenv("JETINBOX_NATS_LOG") != "" {
		out = io.MultiWriter(n.log, &lineFunc{f: func(l string) { c.o.Logf("%s: %s", n.name, l) }})
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: start node %s: %w", n.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	c.mu.Lock()
	n.cmd, n.done, n.paused = cmd, done, false
	c.mu.Unlock()
	c.logf("started %s (pid %d)", n.name, cmd.Process.Pid)
	// A node that exits is seen at once; one that is merely slow (a
	// race-built server on a loaded machine replaying its store) gets a
	// generous ceiling.
	deadline := time.Now().Add(startCeiling)
	for {
		select {
		case <-done:
			c.mu.Lock()
			n.cmd = nil
			c.mu.Unlock()
			return fmt.Errorf("testenv: node %s exited at start (%s):\n%s", n.name, cmd.ProcessState, n.log)
		case <-time.After(20 * time.Millisecond):
		}
		if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.clientPort), time.Second); err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			_ = c.Kill(i)
			return fmt.Errorf("testenv: node %s not ready after %v:\n%s", n.name, startCeiling, n.log)
		}
	}
}

// signal sends sig to node i's process.
func (c *NATSProcs) signal(i int, sig syscall.Signal) (*procNode, error) {
	n := c.node(i)
	if n == nil {
		return nil, fmt.Errorf("testenv: no node %d", i)
	}
	c.mu.Lock()
	cmd := n.cmd
	c.mu.Unlock()
	if cmd == nil {
		return n, fmt.Errorf("testenv: node %s is not running", n.name)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return n, fmt.Errorf("testenv: %s to node %s: %w", sig, n.name, err)
	}
	return n, nil
}

// wait waits until node n's process has exited and forgets it.
func (c *NATSProcs) wait(n *procNode, limit time.Duration) bool {
	c.mu.Lock()
	done := n.done
	c.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
	case <-time.After(limit):
		return false
	}
	c.mu.Lock()
	n.cmd, n.done, n.paused = nil, nil, false
	c.mu.Unlock()
	return true
}

// Kill ends node i with SIGKILL (a paused node too) and waits until the
// process is gone. It hands nothing over: the groups it led elect
// elsewhere after their election timeout. Its store stays for Start; what
// it wrote without fsync survives in the page cache, as after any crash
// that is not a power loss.
func (c *NATSProcs) Kill(i int) error {
	n, err := c.signal(i, syscall.SIGKILL)
	if err != nil {
		return err
	}
	c.wait(n, time.Minute)
	c.logf("killed %s", n.name)
	return nil
}

// KillAll sends SIGKILL to every running node at once (one signal after
// the other, before waiting for any), then waits until all are gone.
func (c *NATSProcs) KillAll() error {
	var killed []*procNode
	var err error
	c.mu.Lock()
	for _, n := range c.nodes {
		if n.cmd != nil {
			if kerr := n.cmd.Process.Signal(syscall.SIGKILL); kerr != nil {
				err = errors.Join(err, fmt.Errorf("testenv: SIGKILL to node %s: %w", n.name, kerr))
			}
			killed = append(killed, n)
		}
	}
	c.mu.Unlock()
	for _, n := range killed {
		c.wait(n, time.Minute)
	}
	c.logf("killed every node")
	return err
}

// Stop shuts node i down with SIGTERM (it hands its leaderships over) and
// waits until it exited; a node that does not exit within 30 seconds is
// killed. A paused node is resumed first.
func (c *NATSProcs) Stop(i int) error {
	if c.paused(i) {
		if err := c.Resume(i); err != nil {
			return err
		}
	}
	n, err := c.signal(i, syscall.SIGTERM)
	if err != nil {
		return err
	}
	if !c.wait(n, 30*time.Second) {
		_ = c.Kill(i)
		return fmt.Errorf("testenv: node %s did not stop within 30s of SIGTERM; killed", n.name)
	}
	c.logf("stopped %s", n.name)
	return nil
}

// Restart stops node i and starts it again.
func (c *NATSProcs) Restart(i int) error {
	if err := c.Stop(i); err != nil {
		return err
	}
	return c.Start(i)
}

func (c *NATSProcs) paused(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].paused
}

// Pause stops node i with SIGSTOP: it keeps its connections and answers
// nothing, as a process stalled by the scheduler, a long GC or a frozen
// VM does, until Resume.
func (c *NATSProcs) Pause(i int) error {
	n, err := c.signal(i, syscall.SIGSTOP)
	if err != nil {
		return err
	}
	c.mu.Lock()
	n.paused = true
	c.mu.Unlock()
	// kill(2) returns before every thread has stopped: wait until the
	// kernel reports the process stopped.
	if err := waitProcState(c.Pid(i), true); err != nil {
		return fmt.Errorf("testenv: pause %s: %w", n.name, err)
	}
	c.logf("paused %s", n.name)
	return nil
}

// waitProcState waits up to five seconds until every thread of process
// pid is stopped (state T in /proc/pid/task/*/stat), or none is.
func waitProcState(pid int, stopped bool) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		if err != nil || len(tasks) == 0 {
			return fmt.Errorf("process %d: no threads (%v)", pid, err)
		}
		all := true
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue // a thread that just ended
			}
			// The state follows the command name, in parentheses.
			s := string(b)
			if k := strings.LastIndexByte(s, ')'); k >= 0 && k+2 < len(s) && (s[k+2] == 'T') != stopped {
				all = false
				break
			}
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not %s after 5s", pid, map[bool]string{true: "stopped", false: "continued"}[stopped])
		}
		time.Sleep(time.Millisecond)
	}
}

// Resume continues node i with SIGCONT after Pause.
func (c *NATSProcs) Resume(i int) error {
	n, err := c.signal(i, syscall.SIGCONT)
	if err != nil {
		return err
	}
	c.mu.Lock()
	n.paused = false
	c.mu.Unlock()
	if err := waitProcState(c.Pid(i), false); err != nil {
		return fmt.Errorf("testenv: resume %s: %w", n.name, err)
	}
	c.logf("resumed %s", n.name)
	return nil
}

// Partition cuts node i off from every other node: the proxies of the
// routes between them close their connections and refuse new ones. Node i
// keeps running and keeps its clients.
func (c *NATSProcs) Partition(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes[i].partitioned = true
	for pair, p := range c.proxies {
		if pair[0] == i || pair[1] == i {
			p.Cut()
		}
	}
	c.logfLocked("partitioned %s", c.nodes[i].name)
}

func (c *NATSProcs) logfLocked(format string, a ...any) {
	if c.o.Logf != nil {
		c.o.Logf(format, a...)
	}
}

// Heal reconnects node i to every node that is not partitioned itself
// (after Partition or BlackHole), and to its clients.
func (c *NATSProcs) Heal(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes[i].partitioned = false
	var err error
	for pair, p := range c.proxies {
		other := -1
		switch i {
		case pair[0]:
			other = pair[1]
		case pair[1]:
			other = pair[0]
		}
		if other < 0 || c.nodes[other].partitioned {
			continue
		}
		if perr := p.Mend(); perr != nil {
			err = errors.Join(err, fmt.Errorf("testenv: heal %s: %w", c.nodes[i].name, perr))
		}
	}
	err = errors.Join(err, c.healClientsLocked(i))
	c.logfLocked("healed %s", c.nodes[i].name)
	return err
}

// AddNode starts a fresh server (a new name, an empty store, routes to
// every node) that joins the cluster, and returns its index. The nodes
// already running accept its routes; each lists it among its own routes
// from its next start.
func (c *NATSProcs) AddNode(ctx context.Context) (int, error) {
	if !c.cluster {
		return -1, errors.New("testenv: AddNode needs a cluster")
	}
	// Its ports are free when chosen, but another process may take one
	// before the server listens: then it gets new ones, a few times.
	var i int
	for attempt := 1; ; attempt++ {
		if err := c.addNode(""); err != nil {
			return -1, err
		}
		i = c.Size() - 1
		err := c.Start(i)
		if err == nil {
			break
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return -1, err
		}
		c.dropLast()
	}
	if err := c.WaitMetaLeader(ctx); err != nil {
		return -1, err
	}
	return i, nil
}

// dropLast forgets the last node added, which never started, and closes
// its route proxies.
func (c *NATSProcs) dropLast() {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := len(c.nodes) - 1
	for pair, p := range c.proxies {
		if pair[0] == i || pair[1] == i {
			p.Close()
			delete(c.proxies, pair)
		}
	}
	if p := c.nodes[i].clientProxy; p != nil {
		p.Close()
	}
	c.nodes = c.nodes[:i]
}

// RemovePeer removes node's replica from stream ($JS.API.STREAM.PEER.REMOVE,
// as `nats stream cluster peer-remove` does): the meta leader places a new
// replica on another server, which catches up from the others.
func (c *NATSProcs) RemovePeer(ctx context.Context, nc *nats.Conn, stream string, node int) error {
	req, _ := json.Marshal(map[string]string{"peer": c.Name(node)})
	if err := jsAPI(ctx, nc, "$JS.API.STREAM.PEER.REMOVE."+stream, req); err != nil {
		return fmt.Errorf("remove %s: %w", c.Name(node), err)
	}
	c.logf("removed %s from stream %s", c.Name(node), stream)
	return nil
}

// Close kills every node, stops the proxies and removes the temp dirs.
func (c *NATSProcs) Close() {
	_ = c.KillAll()
	c.mu.Lock()
	for _, p := range c.proxies {
		p.Close()
	}
	for _, n := range c.nodes {
		if n.clientProxy != nil {
			n.clientProxy.Close()
		}
	}
	c.mu.Unlock()
	if c.sink != nil {
		c.sink.Close()
	}
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}

// answering lists the nodes that run, are not paused and not cut off:
// those whose monitoring port can speak for the cluster.
func (c *NATSProcs) answering() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var is []int
	for i, n := range c.nodes {
		if n.cmd != nil && !n.paused && !n.partitioned {
			is = append(is, i)
		}
	}
	return is
}

// up lists the nodes that run and are not paused.
func (c *NATSProcs) up() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var is []int
	for i, n := range c.nodes {
		if n.cmd != nil && !n.paused {
			is = append(is, i)
		}
	}
	return is
}

// preferAnswering lists the running, unpaused nodes, those not cut off
// first.
func (c *NATSProcs) preferAnswering() []int {
	ok := c.answering()
	for _, i := range c.up() {
		if !slices.Contains(ok, i) {
			ok = append(ok, i)
		}
	}
	return ok
}

// MoveStreamLeader asks stream's leader to step down until another node
// leads it, and returns both nodes (see [Cluster.MoveStreamLeader]).
func (c *NATSProcs) MoveStreamLeader(ctx context.Context, nc *nats.Conn, stream string) (from, to int, err error) {
	return moveLeader(ctx, c.Name, func() int { return c.StreamLeader(stream) }, func() error { return StepDownStream(ctx, nc, stream) })
}

// MoveConsumerLeader is MoveStreamLeader for a consumer.
func (c *NATSProcs) MoveConsumerLeader(ctx context.Context, nc *nats.Conn, stream, consumer string) (from, to int, err error) {
	return moveLeader(ctx, c.Name, func() int { return c.ConsumerLeader(stream, consumer) }, func() error { return StepDownConsumer(ctx, nc, stream, consumer) })
}

var monitorClient = &http.Client{Timeout: 2 * time.Second}

// monitor GETs path from node i's monitoring port into v.
func (c *NATSProcs) monitor(i int, path string, v any) error {
	resp, err := monitorClient.Get(fmt.Sprintf("http://127.0.0.1:%d%s", c.node(i).http, path))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", path, resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// jsz is node i's /jsz with stream and consumer details of the global
// account.
func (c *NATSProcs) jsz(i int) (*server.AccountDetail, *server.JSInfo, error) {
	var info server.JSInfo
	if err := c.monitor(i, "/jsz?acc="+server.DEFAULT_GLOBAL_ACCOUNT+"&streams=true&consumers=true", &info); err != nil {
		return nil, nil, err
	}
	for _, a := range info.AccountDetails {
		if a.Name == server.DEFAULT_GLOBAL_ACCOUNT || a.Id == server.DEFAULT_GLOBAL_ACCOUNT {
			return a, &info, nil
		}
	}
	return nil, &info, nil
}

// streamDetail is node i's view of stream, nil if it holds no replica.
func (c *NATSProcs) streamDetail(i int, stream string) *server.StreamDetail {
	a, _, err := c.jsz(i)
	if err != nil || a == nil {
		return nil
	}
	for k := range a.Streams {
		if a.Streams[k].Name == stream {
			return &a.Streams[k]
		}
	}
	return nil
}

// StreamLeader returns the running, unpaused node that says it leads
// stream, or -1 while none does. A node cut off by Partition may still
// say so until it notices; one that is not cut off is asked first.
func (c *NATSProcs) StreamLeader(stream string) int {
	for _, i := range c.preferAnswering() {
		if d := c.streamDetail(i, stream); d != nil && d.Cluster != nil && d.Cluster.Leader == c.Name(i) {
			return i
		}
	}
	return -1
}

// ConsumerLeader returns the node that says it leads consumer, or -1.
func (c *NATSProcs) ConsumerLeader(stream, consumer string) int {
	for _, i := range c.preferAnswering() {
		d := c.streamDetail(i, stream)
		if d == nil {
			continue
		}
		for _, ci := range d.Consumer {
			if ci != nil && ci.Name == consumer && ci.Cluster != nil && ci.Cluster.Leader == c.Name(i) {
				return i
			}
		}
	}
	return -1
}

// StreamPeers lists the nodes that hold a replica of stream, as its leader
// sees them (nil while it has no leader).
func (c *NATSProcs) StreamPeers(stream string) []int {
	l := c.StreamLeader(stream)
	if l < 0 {
		return nil
	}
	d := c.streamDetail(l, stream)
	if d == nil || d.Cluster == nil {
		return nil
	}
	peers := []int{l}
	for _, r := range d.Cluster.Replicas {
		if n := c.Node(r.Name); n >= 0 {
			peers = append(peers, n)
		}
	}
	slices.Sort(peers)
	return peers
}

// WaitMetaLeader waits until every node that runs, unpaused and not cut
// off, names the same JetStream meta leader.
func (c *NATSProcs) WaitMetaLeader(ctx context.Context) error {
	return poll(ctx, "a JetStream meta leader", func() bool {
		leader := ""
		is := c.answering()
		for _, i := range is {
			_, info, err := c.jsz(i)
			if err != nil || info.Meta == nil || info.Meta.Leader == "" {
				if !c.cluster && err == nil && info != nil && !info.Disabled {
					continue // a single server has no meta group
				}
				return false
			}
			if leader != "" && info.Meta.Leader != leader {
				return false
			}
			leader = info.Meta.Leader
		}
		return len(is) > 0
	})
}

// WaitStreamLeader waits until stream has a leader and returns it.
func (c *NATSProcs) WaitStreamLeader(ctx context.Context, stream string) (int, error) {
	return waitLeader(ctx, "a leader of stream "+stream, func() int { return c.StreamLeader(stream) })
}

// WaitConsumerLeader waits until consumer has a leader and returns it.
func (c *NATSProcs) WaitConsumerLeader(ctx context.Context, stream, consumer string) (int, error) {
	return waitLeader(ctx, "a leader of consumer "+stream+"/"+consumer, func() int { return c.ConsumerLeader(stream, consumer) })
}

// WaitStreamCurrent waits until stream has a leader that is not cut off and
// every replica on a node that runs, unpaused and not cut off, is current.
func (c *NATSProcs) WaitStreamCurrent(ctx context.Context, stream string) error {
	return poll(ctx, "every replica of stream "+stream+" to be current", func() bool {
		l := c.StreamLeader(stream)
		if l < 0 || !slices.Contains(c.answering(), l) {
			return false
		}
		d := c.streamDetail(l, stream)
		if d == nil || d.Cluster == nil {
			return false
		}
		ok := c.answering()
		for _, r := range d.Cluster.Replicas {
			if slices.Contains(ok, c.Node(r.Name)) && (!r.Current || r.Offline) {
				return false
			}
		}
		return true
	})
}

// WaitHealthy waits until every node that runs, unpaused and not cut off,
// answers its /healthz with ok: its JetStream is up and every stream and
// consumer it holds is current.
func (c *NATSProcs) WaitHealthy(ctx context.Context) error {
	return poll(ctx, "every node to be healthy", func() bool {
		for _, i := range c.answering() {
			var h struct {
				Status string `json:"status"`
			}
			if err := c.monitor(i, "/healthz", &h); err != nil || h.Status != "ok" {
				return false
			}
		}
		return true
	})
}

// ReadWhenHealthy is [Cluster.ReadWhenHealthy] for processes: read runs
// once every node is healthy, up to three times.
func (c *NATSProcs) ReadWhenHealthy(ctx context.Context, read func() error, again func(error)) error {
	return readWhenHealthy(ctx, c.WaitHealthy, read, again)
}

// lineFunc calls f with each complete line written to it.
type lineFunc struct {
	mu   sync.Mutex
	part []byte
	f    func(string)
}

func (l *lineFunc) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.part = append(l.part, p...)
	for {
		i := strings.IndexByte(string(l.part), '\n')
		if i < 0 {
			return len(p), nil
		}
		l.f(string(l.part[:i]))
		l.part = l.part[i+1:]
	}
}
