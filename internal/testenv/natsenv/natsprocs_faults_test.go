package natsenv

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestNATSProcsClusterBlackHoleRemove: a black-holed stream leader keeps
// its process and its connections, yet the other two elect a leader and
// take publishes; once healed it catches up. Then a server is removed from
// the cluster ($JS.API.SERVER.REMOVE, as the system account) and a fresh
// one takes its replica, with nothing lost.
func TestNATSProcsClusterBlackHoleRemove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := NewNATSProcs(t, NATSProcsOptions{Nodes: 3, SyncInterval: "always", ClientProxies: true, SystemAccount: true, Logf: t.Logf})
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := CreateStream(ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	publish := func(js jetstream.JetStream, n int) {
		t.Helper()
		for range n {
			for {
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.Publish(pctx, "s.x", []byte("m"))
				pcancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatal(err)
				}
			}
		}
	}
	publish(js, 10)
	l, err := c.WaitStreamLeader(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	pid := c.Pid(l)
	if err := c.BlackHole(l); err != nil {
		t.Fatal(err)
	}
	nl, err := waitLeader(ctx, "a leader other than the black-holed one", func() int {
		if x := c.StreamLeader("S"); x != l {
			return x
		}
		return -1
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Pid(l) != pid {
		t.Fatal("the black-holed node's process changed")
	}
	other, err := nats.Connect(c.URL(nl))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ojs, _ := jetstream.New(other)
	publish(ojs, 10)
	if err := c.Heal(l); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitStreamCurrent(ctx, "S"); err != nil {
		t.Fatal(err)
	}
	n, err := c.AddNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The monitoring answers are read one node at a time, so a leader and
	// its peers are taken from one consistent look, polled until there is one.
	victim := -1
	err = poll(ctx, "a follower of stream S", func() bool {
		l, peers := c.StreamLeader("S"), c.StreamPeers("S")
		for _, p := range peers {
			if l >= 0 && p != l && slices.Contains(peers, l) {
				victim = p
			}
		}
		return victim >= 0
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(victim); err != nil {
		t.Fatal(err)
	}
	err = poll(ctx, "the server removal", func() bool {
		// Ask through whichever node leads now: leadership may move, or
		// be briefly unknown, after the stop.
		via := c.StreamLeader("S")
		if via < 0 || via == victim {
			return false
		}
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		defer rcancel()
		err := c.RemoveServer(rctx, via, victim)
		if err != nil {
			t.Log(err)
		}
		return err == nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = poll(ctx, "the fresh server among the peers", func() bool {
		p := c.StreamPeers("S")
		return len(p) == 3 && slices.Contains(p, n) && !slices.Contains(p, victim)
	})
	if err != nil {
		t.Fatalf("%v: peers %v", err, c.StreamPeers("S"))
	}
	if err := c.WaitStreamCurrent(ctx, "S"); err != nil {
		t.Fatal(err)
	}
	s, err := ojs.Stream(ctx, "S")
	if err != nil || s.CachedInfo().State.Msgs != 20 {
		t.Fatalf("stream after the black hole and the removal: %+v, %v", s.CachedInfo().State, err)
	}
}
