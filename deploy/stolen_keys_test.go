package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/shard"
)

// What a stolen key can do under the shipped configs, on the R3 cluster of
// TestNATSClusterEnforcesTheConfig.
//
// NATS checks the subject a client publishes to against its permissions,
// never the reply subject: a permitted request with the reply subject of a
// stream makes the server publish its answer there, and the stream stores
// it. The producer, the relay and the verifier therefore live in accounts
// of their own that import from JETINBOX only the services they use: a
// request that crosses an import carries a reply subject the server makes
// up (_R_.…), which no stream captures. This test sends every request each
// of those keys may send, with the subjects of every stream as reply
// subjects, and requires every stream to store nothing.
func TestStolenKeyReplySubjects(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fx, defs, urls, adminJS := shippedStreams(t, ctx)
	if _, err := adminJS.Publish(ctx, "notifications.1", []byte(`{"account":1,"amount":1}`), jetstream.WithMsgID("notify:stored")); err != nil {
		t.Fatal(err)
	}
	sd := shardStreamDefs(t)
	streams := []string{defs.intents.Name, defs.dlq.Name, defs.advisories.Name, defs.notifications.Name, sd.stream.Name, sd.dlq.Name, sd.advisories.Name}
	before := streamCounts(t, ctx, adminJS, streams)

	replies := []string{"dlq.intents.x", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.INTENTS.ledger", "notifications.x", "intents.x",
		// The partitioned stream's dead letters, its partitions' advisories,
		// and the stream itself (a reply would be stored under the
		// transform's partition).
		"dlq.pintents.0.k.ledger", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.PINTENTS." + sd.m.Durable(0), "pintents.k.ledger"}
	// Every request each role may send, on both streams.
	roles := map[string][]string{"producer": rolePublish["producer"], "relay": rolePublish["relay"], "verify": rolePublish["verify"]}
	for role, allowed := range roles {
		cl := connectAs(t, urls, fx, role)
		sent := 0
		for _, subj := range allowed {
			m := attackRequest(subj)
			for _, reply := range replies {
				m.Reply = reply
				if err := cl.nc.PublishMsg(m); err != nil {
					t.Fatal(err)
				}
				sent++
			}
		}
		// Permitted requests, all of them: the attack is not refused, its
		// answers go nowhere.
		cl.expectNoAsyncError(t)
		t.Logf("%s: %d requests with stream subjects as reply subjects", role, sent)
	}
	// The answers are published by the servers a moment after the
	// requests; give them time to land in a stream.
	time.Sleep(2 * time.Second)
	after := streamCounts(t, ctx, adminJS, streams)
	if !reflect.DeepEqual(after, before) {
		t.Errorf("streams hold %v after the requests, %v before: a reply subject reached a stream", after, before)
	}

	// The consumer stays in JETINBOX (it publishes dead letters anyway), so
	// its key still reaches the streams through a reply subject: what the
	// rows above would show if the accounts leaked, and the consumer key's
	// residual reach.
	consumer := connectAs(t, urls, fx, "consumer")
	if err := consumer.nc.PublishRequest("$JS.API.STREAM.INFO."+defs.intents.Name, "dlq.intents.x", nil); err != nil {
		t.Fatal(err)
	}
	consumer.expectNoAsyncError(t)
	eventually(t, ctx, func() error {
		n := streamCounts(t, ctx, adminJS, []string{defs.dlq.Name})[defs.dlq.Name]
		if n != after[defs.dlq.Name]+1 {
			return fmt.Errorf("%s holds %d messages, want the consumer's stray reply stored", defs.dlq.Name, n)
		}
		return nil
	})
}

// attackRequest is a well-formed request to subj (a permission pattern with
// its wildcards filled in), so the server answers it.
func attackRequest(subj string) *nats.Msg {
	subj = strings.ReplaceAll(strings.ReplaceAll(subj, ".>", ".attack"), ".*", ".attack")
	m := nats.NewMsg(subj)
	switch {
	case strings.HasPrefix(subj, "intents.") || strings.HasPrefix(subj, "pintents.") || strings.HasPrefix(subj, "notifications."):
		// A publish the stream refuses (pinned to a stream that does not
		// capture it): its PubAck is an error, sent to the reply subject,
		// and the test's streams gain nothing from the publish itself.
		m.Header.Set(jetstream.ExpectedStreamHeader, "NO_SUCH_STREAM")
		m.Data = []byte(`{}`)
	case strings.Contains(subj, ".MSG.GET.") || strings.Contains(subj, ".DIRECT.GET."):
		m.Data = []byte(`{"seq":1}`)
	case strings.Contains(subj, ".CONSUMER.CREATE."):
		m.Data = []byte(`{"stream_name":"INTENTS","config":{"ack_policy":"none","deliver_policy":"all","mem_storage":true,"inactive_threshold":5000000000}}`)
	case strings.Contains(subj, ".MSG.NEXT."):
		m.Data = []byte(`{"batch":1,"expires":1000000000}`)
	}
	return m
}

// streamCounts is the number of messages each stream holds.
func streamCounts(t *testing.T, ctx context.Context, js jetstream.JetStream, names []string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = s.CachedInfo().State.Msgs
	}
	return out
}

// TestStolenVerifierKey: the verifier reads INTENTS and INTENTS_DLQ with
// direct gets and creates no consumer, so its key can neither change or
// delete the production durable nor make the server deliver a stream
// anywhere.
func TestStolenVerifierKey(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fx, defs, urls, adminJS := shippedStreams(t, ctx)
	ledger, err := adminJS.Consumer(ctx, defs.intents.Name, defs.ledger.Durable)
	if err != nil {
		t.Fatal(err)
	}
	want := ledger.CachedInfo().Config
	dlqBefore := streamCounts(t, ctx, adminJS, []string{defs.dlq.Name})

	verifier := connectAs(t, urls, fx, "verify")
	create := func(cfg any) []byte {
		b, err := json.Marshal(map[string]any{"stream_name": defs.intents.Name, "config": cfg})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// The durable as it is, but with a filter that matches nothing, one
	// delivery, a short ack wait, and removed when idle.
	h := want
	h.FilterSubject, h.MaxDeliver, h.AckWait, h.InactiveThreshold = "intents.elsewhere", 1, time.Second, 5*time.Second
	hijack := create(h)
	// A push consumer copying INTENTS into the dead-letter stream.
	copier := create(map[string]any{"name": "copier", "ack_policy": "none", "deliver_subject": "dlq.intents.x", "inactive_threshold": int64(5 * time.Second)})
	attempts := []struct {
		subj string
		body []byte
	}{
		{"$JS.API.CONSUMER.CREATE." + defs.intents.Name + "." + defs.ledger.Durable, hijack},
		{"$JS.API.CONSUMER.CREATE." + defs.intents.Name + "." + defs.ledger.Durable + ".intents.elsewhere", hijack},
		{"$JS.API.CONSUMER.DURABLE.CREATE." + defs.intents.Name + "." + defs.ledger.Durable, hijack},
		{"$JS.API.CONSUMER.CREATE." + defs.intents.Name + ".copier", copier},
		{"$JS.API.CONSUMER.CREATE." + defs.intents.Name, copier},
		{"$JS.API.CONSUMER.CREATE." + defs.dlq.Name + ".copier", copier},
		{"$JS.API.CONSUMER.DELETE." + defs.intents.Name + "." + defs.ledger.Durable, nil},
		// The same on the partitioned stream: a partition's durable, a
		// copier into its dead letters.
		{"$JS.API.CONSUMER.CREATE.PINTENTS.ledger_p00", hijack},
		{"$JS.API.CONSUMER.CREATE.PINTENTS.copier", copier},
		{"$JS.API.CONSUMER.DELETE.PINTENTS.ledger_p00", nil},
	}
	for _, a := range attempts {
		resp, err := verifier.nc.Request(a.subj, a.body, 2*time.Second)
		if err == nil {
			t.Errorf("the verifier's %s was answered: %s", a.subj, resp.Data)
			continue
		}
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("the verifier's %s: %v", a.subj, err)
		}
	}
	time.Sleep(time.Second)
	info, err := ledger.Info(ctx)
	if err != nil {
		t.Fatalf("the ledger durable after the verifier's attempts: %v", err)
	}
	if !reflect.DeepEqual(info.Config, want) {
		t.Errorf("the ledger durable changed:\n got %+v\nwant %+v", info.Config, want)
	}
	intents, err := adminJS.Stream(ctx, defs.intents.Name)
	if err != nil {
		t.Fatal(err)
	}
	names := intents.ConsumerNames(ctx)
	var got []string
	for n := range names.Name() {
		got = append(got, n)
	}
	if names.Err() != nil || len(got) != 1 || got[0] != defs.ledger.Durable {
		t.Errorf("consumers on %s: %v, %v; want the ledger durable alone", defs.intents.Name, got, names.Err())
	}
	if after := streamCounts(t, ctx, adminJS, []string{defs.dlq.Name}); !reflect.DeepEqual(after, dlqBefore) {
		t.Errorf("%s holds %v, %v before", defs.dlq.Name, after, dlqBefore)
	}
}

// shippedStreams starts the shipped R3 cluster, creates the shipped streams
// and consumers as the admin, and stores one intent, so that reads have an
// answer.
func shippedStreams(t *testing.T, ctx context.Context) (*secretsFixture, *jsDefs, string, jetstream.JetStream) {
	t.Helper()
	fsys := loadFiles(t)
	fx := fixture(t)
	defs, err := loadJetStream(fsys)
	if err != nil {
		t.Fatal(err)
	}
	urls := startNATSCluster(t, fsys, fx)
	admin := connectAs(t, urls, fx, "admin")
	adminJS, err := jetstream.New(admin.nc)
	if err != nil {
		t.Fatal(err)
	}
	applyJetStream(t, ctx, adminJS, defs)
	if _, err := adminJS.Publish(ctx, "intents.ledger", []byte(`{"account":1,"amount":1}`), jetstream.WithMsgID("stored")); err != nil {
		t.Fatal(err)
	}
	// The partitioned stream, its dead letters and advisories, and
	// partition 0's durable and rescue durable, as shipped.
	sd := shardStreamDefs(t)
	for _, c := range []jetstream.StreamConfig{sd.advisories, sd.stream, sd.dlq} {
		if _, err := adminJS.CreateStream(ctx, c); err != nil {
			t.Fatalf("create %s: %v", c.Name, err)
		}
	}
	if _, err := adminJS.CreateConsumer(ctx, sd.advisories.Name, sd.rescue); err != nil {
		t.Fatal(err)
	}
	if _, err := adminJS.CreateConsumer(ctx, sd.stream.Name, sd.partition); err != nil {
		t.Fatal(err)
	}
	id := "stored"
	if _, err := adminJS.Publish(ctx, shard.PublishSubject(sd.m.Subject, id, "ledger.1"), []byte(`{"account":1,"amount":1}`), jetstream.WithMsgID(id)); err != nil {
		t.Fatal(err)
	}
	return fx, defs, urls, adminJS
}

func shardStreamDefs(t *testing.T) *shardDefs {
	t.Helper()
	sd, err := loadShardDefs(loadFiles(t))
	if err != nil {
		t.Fatal(err)
	}
	return sd
}

// TestStolenShardConsumerKey: the consumer's key pulls and acks the
// partition durables the admin made, and no more: it cannot create a
// consumer on the partitioned stream (a durable that takes every partition,
// or one that skips them), change or delete one, or publish intents,
// advisories or anything the transform would store.
func TestStolenShardConsumerKey(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fx, _, urls, adminJS := shippedStreams(t, ctx)
	sd := shardStreamDefs(t)
	durable := sd.m.Durable(0)
	p0, err := adminJS.Consumer(ctx, sd.stream.Name, durable)
	if err != nil {
		t.Fatal(err)
	}
	want := p0.CachedInfo().Config
	before := streamCounts(t, ctx, adminJS, []string{sd.stream.Name, sd.dlq.Name, sd.advisories.Name})

	consumer := connectAs(t, urls, fx, "consumer")
	// Partition 0's durable on every partition, with one delivery.
	h := want
	h.FilterSubject, h.MaxDeliver = sd.m.Subject+".>", 1
	body, err := json.Marshal(map[string]any{"stream_name": sd.stream.Name, "config": h})
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{
		"$JS.API.CONSUMER.CREATE." + sd.stream.Name + "." + durable,
		"$JS.API.CONSUMER.CREATE." + sd.stream.Name + "." + durable + "." + sd.m.Subject + ".>",
		"$JS.API.CONSUMER.DURABLE.CREATE." + sd.stream.Name + "." + durable,
		"$JS.API.CONSUMER.CREATE." + sd.stream.Name,
		"$JS.API.CONSUMER.DELETE." + sd.stream.Name + "." + durable,
		"$JS.API.CONSUMER.DELETE." + sd.advisories.Name + "." + durable,
		"$JS.API.STREAM.UPDATE." + sd.stream.Name,
	} {
		if resp, err := consumer.nc.Request(subj, body, 2*time.Second); err == nil {
			t.Errorf("the consumer's %s was answered: %s", subj, resp.Data)
		}
		consumer.waitViolation(t, fmt.Sprintf("%q", subj))
	}
	for _, subj := range []string{
		shard.PublishSubject(sd.m.Subject, "forged", "ledger.1"),
		sd.m.Subject + ".0." + shard.Key("forged") + ".ledger.1",
		"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + sd.stream.Name + "." + durable,
	} {
		consumer.expectPublishDenied(t, subj)
	}
	info, err := p0.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(info.Config, want) {
		t.Errorf("%s changed:\n got %+v\nwant %+v", durable, info.Config, want)
	}
	if after := streamCounts(t, ctx, adminJS, []string{sd.stream.Name, sd.dlq.Name, sd.advisories.Name}); !reflect.DeepEqual(after, before) {
		t.Errorf("streams hold %v, %v before", after, before)
	}
	s, err := adminJS.Stream(ctx, sd.stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Consumers; n != 1 {
		t.Errorf("%s has %d consumers, want %s alone", sd.stream.Name, n, durable)
	}
}
