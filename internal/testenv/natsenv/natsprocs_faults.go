// The faults that close nothing: a node black-holed, a route cut one way;
// and a server removed from the cluster.

package natsenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// The users of a NATSProcs with a system account.
const (
	appUser = "app"
	sysUser = "sys"
)

// SysURL is node i's client URL for the system account's user (direct to
// the node, past any client proxy): the operator's link.
func (c *NATSProcs) SysURL(i int) string {
	return fmt.Sprintf("nats://%s:%s@127.0.0.1:%d", sysUser, sysUser, c.node(i).clientPort)
}

// BlackHole drops every byte between node i and every other node, and
// between node i and its clients when they come through client proxies,
// without closing anything: writes succeed, nothing arrives, and new
// connections are accepted and go nowhere. Node i and its peers learn of
// it only from their own timeouts. Heal ends it (and resets the links it
// touched). Like Partition, it marks node i as cut off.
func (c *NATSProcs) BlackHole(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes[i].partitioned = true
	var err error
	for pair, p := range c.proxies {
		if pair[0] == i || pair[1] == i {
			err = errors.Join(err, p.BlackHole())
		}
	}
	if p := c.nodes[i].clientProxy; p != nil {
		err = errors.Join(err, p.BlackHole())
	}
	c.logfLocked("black-holed %s", c.nodes[i].name)
	return err
}

// CutOneWay makes node to stop hearing node from, while from still hears
// to: on every route between them (either may have dialed) the bytes from
// from to to are dropped, the other direction flows, nothing is closed.
// HealLink ends it.
func (c *NATSProcs) CutOneWay(from, to int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.proxies[[2]int{from, to}]; p != nil {
		p.DropToUpstream() // from dialed to
	}
	if p := c.proxies[[2]int{to, from}]; p != nil {
		p.DropFromUpstream() // to dialed from
	}
	c.logfLocked("%s no longer hears %s", c.nodes[to].name, c.nodes[from].name)
}

// CutLink cuts the routes between a and b only (both directions, their
// connections closed and refused), as Partition does for every route of
// one node: a and b each still reach the others. HealLink ends it.
func (c *NATSProcs) CutLink(a, b int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, pair := range [][2]int{{a, b}, {b, a}} {
		if p := c.proxies[pair]; p != nil {
			p.Cut()
		}
	}
	c.logfLocked("cut the routes between %s and %s", c.nodes[a].name, c.nodes[b].name)
}

// HealLink mends the routes between a and b, after CutOneWay or CutLink.
func (c *NATSProcs) HealLink(a, b int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	for _, pair := range [][2]int{{a, b}, {b, a}} {
		if p := c.proxies[pair]; p != nil {
			err = errors.Join(err, p.Mend())
		}
	}
	c.logfLocked("healed the routes between %s and %s", c.nodes[a].name, c.nodes[b].name)
	return err
}

// healClientsLocked mends node i's client proxy, if any (Heal calls it).
func (c *NATSProcs) healClientsLocked(i int) error {
	if p := c.nodes[i].clientProxy; p != nil {
		return p.Mend()
	}
	return nil
}

// RemoveServer removes node i from the cluster's JetStream meta group
// ($JS.API.SERVER.REMOVE, as `nats server cluster peer-remove` does),
// asked of the meta leader through node via, as the system account's
// user (SystemAccount). The streams it held place their replicas
// elsewhere. The node's process is left as it is: the caller stops it.
func (c *NATSProcs) RemoveServer(ctx context.Context, via, i int) error {
	if !c.o.SystemAccount {
		return errors.New("testenv: RemoveServer needs SystemAccount")
	}
	if c.node(via) == nil || c.node(i) == nil {
		return fmt.Errorf("testenv: RemoveServer(via %d, node %d): no such node", via, i)
	}
	nc, err := nats.Connect(c.SysURL(via), nats.Name("testenv-operator"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("testenv: connect to %s as the system account: %w", c.Name(via), err)
	}
	defer nc.Close()
	req, _ := json.Marshal(map[string]string{"peer": c.Name(i)})
	if err := jsAPI(ctx, nc, "$JS.API.SERVER.REMOVE", req); err != nil {
		return fmt.Errorf("remove server %s: %w", c.Name(i), err)
	}
	c.logf("removed server %s from the cluster", c.Name(i))
	return nil
}

// StreamState is node i's replica of stream as its monitoring port shows
// it: messages, first and last sequence; ok false if it holds none or
// does not answer.
func (c *NATSProcs) StreamState(i int, stream string) (msgs, first, last uint64, ok bool) {
	d := c.streamDetail(i, stream)
	if d == nil {
		return 0, 0, 0, false
	}
	return d.State.Msgs, d.State.FirstSeq, d.State.LastSeq, true
}
