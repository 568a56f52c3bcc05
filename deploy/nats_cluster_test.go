package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// TestNATSClusterEnforcesTheConfig runs the three node configs, as parsed
// from deploy/nats with the keys cmd/devsecrets makes, as a real R3 cluster
// on loopback (mutual TLS on clients and routes included), creates the
// streams and consumers from deploy/jetstream as the admin user, and then
// checks that each user can do its job and nothing else: the permissions
// and stream settings are enforced by the server, not just spelled right.
func TestNATSClusterEnforcesTheConfig(t *testing.T) {
	t.Parallel()
	fsys := loadFiles(t)
	fx := fixture(t)
	urls := startNATSCluster(t, fsys, fx)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	// Only a known nkey with a certificate from our CA gets in.
	t.Run("authentication", func(t *testing.T) {
		ca := filepath.Join(fx.dir, "tls", "ca.pem")
		nkeyOpt, err := nats.NkeyOptionFromSeed(filepath.Join(fx.dir, "nkeys", "producer.nk"))
		if err != nil {
			t.Fatal(err)
		}
		if nc, err := nats.Connect(urls, nkeyOpt, nats.RootCAs(ca), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Error("a client without a certificate was let in (verify: true is not enforced)")
		}
		stranger, _ := nkeys.CreateUser()
		pub, _ := stranger.PublicKey()
		if nc, err := nats.Connect(urls, nats.Nkey(pub, stranger.Sign), nats.RootCAs(ca),
			nats.ClientCert(filepath.Join(fx.dir, "tls", "producer.pem"), filepath.Join(fx.dir, "tls", "producer-key.pem")),
			nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Error("an unknown nkey was let in")
		}
	})

	admin := connectAs(t, urls, fx, "admin")
	adminJS, err := jetstream.New(admin.nc)
	if err != nil {
		t.Fatal(err)
	}
	defs, err := loadJetStream(fsys)
	if err != nil {
		t.Fatal(err)
	}
	intents := applyJetStream(t, ctx, adminJS, defs)
	info, err := intents.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || len(info.Cluster.Replicas)+1 != 3 {
		t.Fatalf("stream INTENTS is not on three servers: %+v", info.Cluster)
	}

	producer := connectAs(t, urls, fx, "producer")
	consumer := connectAs(t, urls, fx, "consumer")

	t.Run("producer", func(t *testing.T) {
		js, err := jetstream.New(producer.nc)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.Publish(ctx, "intents.transfer", []byte(`{"amount":1}`), jetstream.WithMsgID("intent-1"))
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		if ack.Stream != "INTENTS" || ack.Duplicate {
			t.Fatalf("ack %+v", ack)
		}
		first := ack.Sequence
		ack, err = js.Publish(ctx, "intents.transfer", []byte(`{"amount":1}`), jetstream.WithMsgID("intent-1"))
		if err != nil || !ack.Duplicate || ack.Sequence != first {
			t.Fatalf("a retry inside the duplicate window must be a duplicate of sequence %d: %+v, %v", first, ack, err)
		}
		// The producer reads the message a duplicate PubAck names, to
		// tell a retry from an ID reused with another payload: with the
		// STREAM.MSG.GET API, which the leader answers (not a direct get,
		// which a lagging replica may answer).
		if m, err := msgGet(ctx, producer.nc, "INTENTS", first); err != nil || string(m.Data) != `{"amount":1}` || m.Header.Get(jetstream.MsgIDHeader) != "intent-1" {
			t.Fatalf("read back sequence %d as the producer: %+v, %v", first, m, err)
		}
		if _, err := js.Publish(ctx, "intents.transfer", []byte(`{"amount":2}`), jetstream.WithMsgID("intent-2")); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Stream(ctx, "INTENTS"); err != nil {
			t.Errorf("stream info: %v", err)
		}
		for _, subj := range []string{"dlq.intents.transfer", "$JS.API.STREAM.DELETE.INTENTS", "$JS.API.STREAM.PURGE.INTENTS",
			"$JS.API.CONSUMER.CREATE.INTENTS.mine", "$JS.API.CONSUMER.MSG.NEXT.INTENTS.ledger", "$JS.ACK.INTENTS.ledger.1.1.1.1.1",
			"$JS.API.STREAM.MSG.GET.INTENTS_DLQ", "$JS.API.STREAM.MSG.GET.INTENTS_ADVISORIES",
			"$JS.API.CONSUMER.MSG.NEXT.INTENTS_ADVISORIES.ledger", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.INTENTS.ledger"} {
			producer.expectPublishDenied(t, subj)
		}
		producer.expectSubscribeDenied(t, "intents.>")
		// Replies are per role: the producer hears neither the shared
		// default prefix nor the consumer's deliveries.
		producer.expectSubscribeDenied(t, "_INBOX.>")
		producer.expectSubscribeDenied(t, inboxPrefix["consumer"]+".>")
		producer.expectSubscribeDenied(t, "$JS.EVENT.ADVISORY.>")
	})

	t.Run("consumer", func(t *testing.T) {
		js, err := jetstream.New(consumer.nc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Stream(ctx, "INTENTS"); err != nil {
			t.Errorf("stream info: %v", err)
		}
		cons, err := js.Consumer(ctx, "INTENTS", "ledger")
		if err != nil {
			t.Fatalf("consumer lookup: %v", err)
		}
		batch, err := cons.Fetch(2, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var msgs []jetstream.Msg
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if batch.Error() != nil || len(msgs) != 2 {
			t.Fatalf("fetched %d messages, err %v", len(msgs), batch.Error())
		}
		if r := msgs[0].Reply(); !strings.HasPrefix(r, "$JS.ACK.INTENTS.ledger.") {
			t.Fatalf("ack subject %q is not covered by the consumer's $JS.ACK.INTENTS.ledger.> permission", r)
		}
		// Ack after commit: a confirmed ack needs publish on $JS.ACK and a reply inbox.
		if err := msgs[0].DoubleAck(ctx); err != nil {
			t.Fatalf("ack: %v", err)
		}
		// A poison message: dead-letter it, then Term.
		dl, err := js.Publish(ctx, "dlq.intents.transfer", msgs[1].Data(), jetstream.WithMsgID("intent-2"))
		if err != nil || dl.Stream != "INTENTS_DLQ" {
			t.Fatalf("dead-letter publish: %+v, %v", dl, err)
		}
		if err := msgs[1].Term(); err != nil {
			t.Fatal(err)
		}
		consumer.expectNoAsyncError(t)
		// Term is not confirmed: the server may count it a moment later
		// (on a cluster, after the consumer's leader has replicated it).
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			ci, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if ci.NumAckPending == 0 && ci.NumPending == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("after ack and term: ack pending %d, pending %d", ci.NumAckPending, ci.NumPending)
				break
			}
		}
		for _, subj := range []string{"intents.transfer", "$JS.API.CONSUMER.CREATE.INTENTS.other", "$JS.API.CONSUMER.DURABLE.CREATE.INTENTS.other",
			"$JS.API.CONSUMER.DELETE.INTENTS.ledger", "$JS.API.CONSUMER.MSG.NEXT.INTENTS_DLQ.reader", "$JS.API.STREAM.PURGE.INTENTS",
			"$JS.API.STREAM.MSG.DELETE.INTENTS", "$JS.ACK.INTENTS_DLQ.reader.1.1.1.1.1",
			// The advisory stream: only the durable's own advisories, and
			// nothing that creates, deletes or forges them.
			"$JS.API.STREAM.CREATE.INTENTS_ADVISORIES", "$JS.API.STREAM.PURGE.INTENTS_ADVISORIES", "$JS.API.STREAM.MSG.DELETE.INTENTS_ADVISORIES",
			"$JS.API.CONSUMER.CREATE.INTENTS_ADVISORIES.other", "$JS.API.CONSUMER.DELETE.INTENTS_ADVISORIES.ledger",
			"$JS.API.CONSUMER.MSG.NEXT.INTENTS_ADVISORIES.other", "$JS.ACK.INTENTS_ADVISORIES.other.1.1.1.1.1",
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.INTENTS.ledger"} {
			consumer.expectPublishDenied(t, subj)
		}
		consumer.expectSubscribeDenied(t, "intents.>")
		consumer.expectSubscribeDenied(t, inboxPrefix["producer"]+".>")
		// Max-deliveries advisories are read from their stream, not heard
		// on core NATS.
		consumer.expectSubscribeDenied(t, "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.INTENTS.ledger")
	})

	// The relay publishes notifications and looks NOTIFICATIONS up; it may
	// not publish intents or dead letters, read anyone's deliveries or
	// replies, pull or ack, or touch a stream.
	t.Run("relay", func(t *testing.T) {
		relay := connectAs(t, urls, fx, "relay")
		js, err := jetstream.New(relay.nc)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.Publish(ctx, "notifications.1", []byte(`{"account":1,"amount":1}`), jetstream.WithMsgID("notify:intent-1"),
			jetstream.WithExpectStream(defs.notifications.Name))
		if err != nil || ack.Stream != defs.notifications.Name {
			t.Fatalf("relay publish: %+v, %v", ack, err)
		}
		if _, err := js.Stream(ctx, defs.notifications.Name); err != nil {
			t.Fatalf("stream info as the relay: %v", err)
		}
		if m, err := msgGet(ctx, relay.nc, defs.notifications.Name, ack.Sequence); err != nil || m.Header.Get(jetstream.MsgIDHeader) != "notify:intent-1" {
			t.Fatalf("read back as the relay: %+v, %v", m, err)
		}
		for _, subj := range []string{"intents.transfer", "intents.ledger", "dlq.intents.transfer", "dlq.notifications.1",
			"$JS.API.STREAM.INFO.INTENTS", "$JS.API.STREAM.MSG.GET.INTENTS", "$JS.API.CONSUMER.MSG.NEXT.INTENTS.ledger", "$JS.ACK.INTENTS.ledger.1.1.1.1.1",
			"$JS.API.CONSUMER.CREATE.NOTIFICATIONS.mine", "$JS.API.CONSUMER.CREATE.INTENTS.mine", "$JS.API.STREAM.DELETE.NOTIFICATIONS",
			"$JS.API.STREAM.PURGE.NOTIFICATIONS", "$JS.API.STREAM.MSG.DELETE.NOTIFICATIONS", "$JS.API.STREAM.UPDATE.NOTIFICATIONS",
			"$JS.API.STREAM.CREATE.OTHER"} {
			relay.expectPublishDenied(t, subj)
		}
		// No deliveries, no one else's replies, no intents on core NATS.
		for _, subj := range []string{"intents.>", "notifications.>", "_INBOX.>", inboxPrefix["consumer"] + ".>", inboxPrefix["producer"] + ".>", "$JS.EVENT.ADVISORY.>"} {
			relay.expectSubscribeDenied(t, subj)
		}
		// And nobody else may publish notifications.
		producer.expectPublishDenied(t, "notifications.1")
		consumer.expectPublishDenied(t, "notifications.1")
	})

	t.Run("stream settings", func(t *testing.T) {
		if err := intents.DeleteMsg(ctx, 1); err == nil || !strings.Contains(err.Error(), "not permitted") {
			t.Errorf("deleting a message from INTENTS: %v; want refused by deny_delete", err)
		}
		if err := intents.Purge(ctx); err == nil || !strings.Contains(err.Error(), "not permitted") {
			t.Errorf("purging INTENTS: %v; want refused by deny_purge", err)
		}
		notes, err := adminJS.Stream(ctx, defs.notifications.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := notes.Purge(ctx); err == nil || !strings.Contains(err.Error(), "not permitted") {
			t.Errorf("purging %s as the admin: %v; want refused by deny_purge", defs.notifications.Name, err)
		}
		adv, err := adminJS.Stream(ctx, defs.advisories.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := adv.Purge(ctx); err == nil || !strings.Contains(err.Error(), "not permitted") {
			t.Errorf("purging %s: %v; want refused by deny_purge", defs.advisories.Name, err)
		}
		rc, err := adv.Consumer(ctx, defs.rescue.Durable)
		if err != nil {
			t.Fatal(err)
		}
		if got := rc.CachedInfo().Config; got.FilterSubject != defs.rescue.FilterSubject || got.AckWait != defs.rescue.AckWait ||
			got.MaxDeliver != -1 || got.MaxAckPending != defs.rescue.MaxAckPending || got.AckPolicy != jetstream.AckExplicitPolicy {
			t.Errorf("the server's rescue consumer config differs from ledger-rescue-consumer.json: %+v", got)
		}
		ci, err := adminJS.Consumer(ctx, "INTENTS", "ledger")
		if err != nil {
			t.Fatal(err)
		}
		got := ci.CachedInfo().Config
		if got.AckWait != defs.ledger.AckWait || got.MaxDeliver != defs.ledger.MaxDeliver || got.MaxAckPending != defs.ledger.MaxAckPending || got.AckPolicy != jetstream.AckExplicitPolicy {
			t.Errorf("the server's consumer config differs from ledger-consumer.json: %+v", got)
		}
	})
}

// msgGet reads the message at seq of stream with the STREAM.MSG.GET API, as
// jsinbox's publisher reads back a duplicate.
func msgGet(ctx context.Context, nc *nats.Conn, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, fmt.Appendf(nil, `{"seq":%d}`, seq))
	if err != nil {
		return nil, err
	}
	var r struct {
		Message *struct {
			Subject string `json:"subject"`
			Header  []byte `json:"hdrs"`
			Data    []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, err
	}
	if r.Error != nil {
		return nil, r.Error
	}
	if r.Message == nil {
		return nil, fmt.Errorf("no message %d in %s", seq, resp.Data)
	}
	m := &jetstream.RawStreamMsg{Subject: r.Message.Subject, Sequence: seq, Data: r.Message.Data}
	if len(r.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// startNATSCluster runs the three node configs of fsys, with the auth.conf
// cmd/devsecrets writes (the shipped one with fresh keys), as an R3 cluster
// on loopback, mutual TLS included. It returns the client URLs.
func startNATSCluster(t *testing.T, fsys files, fx *secretsFixture) string {
	t.Helper()
	auth, err := os.ReadFile(filepath.Join(fx.dir, "nats-auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := stageNATS(fsys, t.TempDir(), filepath.Join(fx.dir, "tls"), auth)
	if err != nil {
		t.Fatal(err)
	}
	// Loopback instead of the container network; everything else as parsed.
	// JetStream clustering needs the routes configured up front, so the
	// route ports are picked before the servers start; client ports are the
	// servers' own pick. A port picked free can be taken by another test
	// before its server listens (the server then never gets ready): the
	// cluster is started again on new ports, a few times.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		urls, stop, err := startNATSNodes(t, nodes)
		if err == nil {
			t.Cleanup(stop)
			return urls
		}
		stop()
		lastErr = err
		t.Logf("NATS cluster, attempt %d: %v; again on new ports", attempt+1, err)
	}
	t.Fatalf("%v (set JETINBOX_NATS_LOG=1 to see its log)", lastErr)
	return ""
}

// startNATSNodes starts the nodes on loopback with route ports of their
// own; stop shuts down what it started, also on an error.
func startNATSNodes(t *testing.T, nodes map[string]string) (string, func(), error) {
	t.Helper()
	routePorts := freePorts(t, len(natsNodes))
	var clientURLs []string
	var started []*server.Server
	stop := func() {
		for _, s := range started {
			s.Shutdown()
		}
	}
	for i, n := range natsNodes {
		opts, err := validateNATSNode(nodes[n], n)
		if err != nil {
			t.Fatal(err)
		}
		opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", server.RANDOM_PORT, 0
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", routePorts[i]
		opts.Routes = nil
		for j := range natsNodes {
			if j != i {
				u, _ := url.Parse(fmt.Sprintf("nats-route://localhost:%d", routePorts[j]))
				opts.Routes = append(opts.Routes, u)
			}
		}
		opts.StoreDir = t.TempDir()
		opts.NoLog, opts.NoSigs = os.Getenv("JETINBOX_NATS_LOG") == "", true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if !opts.NoLog {
			s.ConfigureLogger()
		}
		go s.Start()
		started = append(started, s)
		if !s.ReadyForConnections(30 * time.Second) {
			return "", stop, fmt.Errorf("%s not ready", n)
		}
		clientURLs = append(clientURLs, fmt.Sprintf("tls://localhost:%d", s.Addr().(*net.TCPAddr).Port))
	}
	return strings.Join(clientURLs, ","), stop, nil
}

// applyJetStream creates the streams and consumers of defs as the operator
// does (compose's nats-setup, the Kubernetes steps): the advisory stream
// and the rescue consumer first, so that no max-deliveries advisory is ever
// sent with nowhere to keep it, then the intents stream, the dead letters
// and the durable. It returns the intents stream.
func applyJetStream(t *testing.T, ctx context.Context, js jetstream.JetStream, defs *jsDefs) jetstream.Stream {
	t.Helper()
	// The meta group needs all three servers before it places R3 streams.
	eventually(t, ctx, func() error {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.CreateStream(actx, defs.advisories)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil // an earlier attempt that timed out made it
		}
		return err
	})
	if _, err := js.CreateConsumer(ctx, defs.advisories.Name, defs.rescue); err != nil {
		t.Fatalf("create consumer %s on %s: %v", defs.rescue.Durable, defs.advisories.Name, err)
	}
	intents, err := js.CreateStream(ctx, defs.intents)
	if err != nil {
		t.Fatalf("create %s: %v", defs.intents.Name, err)
	}
	if _, err := js.CreateStream(ctx, defs.dlq); err != nil {
		t.Fatalf("create %s: %v", defs.dlq.Name, err)
	}
	if _, err := js.CreateConsumer(ctx, defs.intents.Name, defs.ledger); err != nil {
		t.Fatalf("create consumer %s on %s: %v", defs.ledger.Durable, defs.intents.Name, err)
	}
	if _, err := js.CreateStream(ctx, defs.notifications); err != nil {
		t.Fatalf("create %s: %v", defs.notifications.Name, err)
	}
	return intents
}

type client struct {
	nc   *nats.Conn
	errs chan error
}

func connectAs(t *testing.T, urls string, fx *secretsFixture, user string) *client {
	t.Helper()
	c := &client{errs: make(chan error, 64)}
	nkeyOpt, err := nats.NkeyOptionFromSeed(filepath.Join(fx.dir, "nkeys", user+".nk"))
	if err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{nkeyOpt, nats.Name(user),
		nats.RootCAs(filepath.Join(fx.dir, "tls", "ca.pem")),
		nats.ClientCert(filepath.Join(fx.dir, "tls", user+".pem"), filepath.Join(fx.dir, "tls", user+"-key.pem")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case c.errs <- err:
			default:
			}
		})}
	// Each role's replies under its own prefix (the only one it may
	// subscribe to), as the shipped compose and Kubernetes files set it.
	if p := inboxPrefix[user]; p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	c.nc, err = nats.Connect(urls, opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(c.nc.Close)
	return c
}

// waitViolation waits for the server's permissions violation naming what.
func (c *client) waitViolation(t *testing.T, what string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-c.errs:
			if strings.Contains(strings.ToLower(err.Error()), "permissions violation") && strings.Contains(err.Error(), what) {
				return
			}
		case <-deadline:
			t.Errorf("%s: no permissions violation for %s", c.nc.Opts.Name, what)
			return
		}
	}
}

func (c *client) expectPublishDenied(t *testing.T, subject string) {
	t.Helper()
	if err := c.nc.Publish(subject, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	c.waitViolation(t, fmt.Sprintf("%q", subject))
}

func (c *client) expectSubscribeDenied(t *testing.T, subject string) {
	t.Helper()
	sub, err := c.nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	c.waitViolation(t, fmt.Sprintf("%q", subject))
}

// expectNoAsyncError checks that everything sent so far was allowed: the
// server reports violations asynchronously, so flush (a round trip) first.
func (c *client) expectNoAsyncError(t *testing.T) {
	t.Helper()
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.errs:
		t.Errorf("%s: unexpected async error: %v", c.nc.Opts.Name, err)
	default:
	}
}

// eventually retries f until it succeeds or ctx ends.
func eventually(t *testing.T, ctx context.Context, f func() error) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("gave up: %v", errors.Join(err, ctx.Err()))
		case <-tick.C:
		}
	}
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}
