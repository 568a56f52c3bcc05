package natsenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterFaults drives every fault the cluster offers on an R3 stream
// and checks each did what it says: a stopped leader is replaced, a
// step-down moves leadership, a partitioned node can no longer store
// anything (its clients get no PubAck) while the majority goes on, and after
// the heal it holds what the majority stored.
func TestClusterFaults(t *testing.T) {
	c := NewCluster(t, ClusterOptions{})
	// A ceiling, not a pace: every wait below polls its condition. A
	// quiet CI run spent the whole 2 minutes this had before and failed
	// at the partition's election ("a leader in the majority").
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := CreateStream(ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateConsumer(ctx, js, "S", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	seq := 0
	publish := func(js jetstream.JetStream) error {
		seq++
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.Publish(pctx, "s.x", []byte("x"), jetstream.WithMsgID(fmt.Sprint("m", seq)))
		return err
	}
	publishEventually := func() {
		t.Helper()
		if err := poll(ctx, "a publish to succeed", func() bool { return publish(js) == nil }); err != nil {
			t.Fatal(err)
		}
	}
	publishEventually()

	// Kill the stream leader: the other two elect a new one.
	l, err := c.WaitStreamLeader(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	c.Kill(l)
	nl, err := c.WaitStreamLeader(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if nl == l {
		t.Fatalf("killed node %s still leads", c.Name(l))
	}
	publishEventually()
	if err := c.Start(l); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitStreamCurrent(ctx, "S"); err != nil {
		t.Fatal(err)
	}

	// Step-downs move stream and consumer leadership.
	if from, to, err := c.MoveStreamLeader(ctx, nc, "S"); err != nil || from == to {
		t.Fatalf("stream leader %d → %d: %v", from, to, err)
	}
	if from, to, err := c.MoveConsumerLeader(ctx, nc, "S", "d"); err != nil || from == to {
		t.Fatalf("consumer leader %d → %d: %v", from, to, err)
	}
	if err := StepDownStream(ctx, nc, "NOPE"); err == nil {
		t.Error("step-down of a missing stream succeeded")
	}

	// Partition the stream leader. A client that can only reach it gets no
	// PubAck; the majority elects a leader and stores on.
	if l, err = c.WaitStreamLeader(ctx, "S"); err != nil {
		t.Fatal(err)
	}
	minority, err := nats.Connect(c.URL(l), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer minority.Close()
	mjs, _ := jetstream.New(minority)
	c.Partition(l)
	// Cut off means no route at all: none through the proxies, and none
	// the nodes found by gossip around them.
	if err := poll(ctx, "the cut-off node to lose every route", func() bool { return c.Server(l).NumRoutes() == 0 }); err != nil {
		rz, _ := c.Server(l).Routez(nil)
		t.Fatalf("%v: %s still has %d routes: %+v", err, c.Name(l), c.Server(l).NumRoutes(), rz)
	}
	if err := poll(ctx, "a leader in the majority", func() bool {
		for i := range ClusterSize {
			if i != l && c.Server(i).JetStreamIsStreamLeader("$G", "S") {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	// The first client may be connected to the cut-off node: publish
	// through one of the others.
	majority, err := nats.Connect(c.URL((l+1)%ClusterSize), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer majority.Close()
	majJS, _ := jetstream.New(majority)
	if err := poll(ctx, "a publish to the majority to succeed", func() bool { return publish(majJS) == nil }); err != nil {
		t.Fatal(err)
	}
	stored := 0
	for range 3 {
		if publish(mjs) == nil {
			stored++
		}
	}
	if stored > 0 {
		t.Errorf("%d publishes acknowledged by a node cut off from the majority", stored)
	}
	if err := c.Heal(l); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitStreamCurrent(ctx, "S"); err != nil {
		t.Fatal(err)
	}
	// The healed node has the majority's messages: read through it.
	want := uint64(0)
	if err := poll(ctx, "the healed node to catch up", func() bool {
		info, err := majJS.Stream(ctx, "S")
		if err != nil {
			return false
		}
		want = info.CachedInfo().State.Msgs
		return c.Server(l).JetStreamIsStreamCurrent("$G", "S")
	}); err != nil {
		t.Fatal(err)
	}
	if want != 3 {
		t.Errorf("stream holds %d messages, want the 3 the majority acknowledged", want)
	}
}
