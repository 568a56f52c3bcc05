package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestVerifyShardsRescue: verify -shards judges the rescues of the
// partition durables as verify judges the single stream's. A message the
// server gave up on whose advisory no rescue has settled awaits its
// rescue, not lost; an expired record (the message aged out before its
// rescue) whose sequence a shard's inbox applied is settled, its ledger
// entry no unexpected one; an expired record no shard's inbox names is a
// violation of its own kind.
func TestVerifyShardsRescue(t *testing.T) {
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	urls := map[string]string{}
	m := shard.Map{Partitions: 4}
	for i, name := range []string{"a", "b"} {
		urls[name] = testenv.NewDatabase(t)
		set, _ := shard.ParseSet([]string{"0-1", "2-3"}[i])
		m.Shards = append(m.Shards, shard.Shard{Name: name, DatabaseURLEnv: "SHARD_" + strings.ToUpper(name) + "_URL", Partitions: set})
	}
	file := filepath.Join(t.TempDir(), "shards.json")
	m = m.WithDefaults()
	if err := m.Save(file); err != nil {
		t.Fatal(err)
	}
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "SHARD_A_URL": urls["a"], "SHARD_B_URL": urls["b"]})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := Jetinbox(ctx, args, env, nil, &out, &errOut)
		return out.String() + errOut.String(), err
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// Messages age out of the stream in seconds.
	const maxAge = 2 * time.Second
	if err := m.EnsureStream(ctx, js, jsinbox.StreamConfig{MaxAge: maxAge, DuplicateWindow: time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		for _, args := range [][]string{{"migrate", "-shards", file, "-shard", name}, {"accounts", "-open", "1-16", "-database-url", urls[name]}} {
			if out, err := run(args...); err != nil {
				t.Fatalf("%v: %v\n%s", args, err, out)
			}
		}
	}
	publish := func(id string) uint64 {
		t.Helper()
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: shard.PublishSubject(m.Subject, id, "ledger.1"), Data: []byte(`{"account":3,"amount":5}`),
			Header: nats.Header{jetstream.MsgIDHeader: {id}}})
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}

	// Applied by the shard that owns it; then (its ack lost, given up on)
	// it ages out before a rescue reads it back.
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cli.Consumer(cctx, []string{"-shards", file, "-shard", name, "-http", ""}, env, io.Discard, io.Discard); err != nil {
				t.Errorf("consumer %s: %v", name, err)
			}
		}()
	}
	applied := "expired-applied"
	appliedSeq := publish(applied)
	owner, err := pgxpool.New(ctx, urls[m.Owner(shard.PartitionOf(applied, m.Partitions))])
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	for n := 0; n == 0; time.Sleep(20 * time.Millisecond) {
		if err := owner.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE message_id = $1 AND status = 'applied'`, applied).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	wg.Wait()
	// Never applied: no consumer runs until it has aged out.
	neverSeq := publish("expired-never")
	s, err := js.Stream(ctx, m.Stream)
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The records a rescue leaves for the two (jsinbox's rescueGone).
	for _, seq := range []uint64{appliedSeq, neverSeq} {
		n := strconv.FormatUint(seq, 10)
		rec := &nats.Msg{Subject: "dlq." + m.Subject + "._expired_._expired_", Header: nats.Header{
			jsinbox.HeaderStatus: {jsinbox.DeadLetterExpired}, jsinbox.HeaderReason: {"aged out before its rescue (test)"},
			jsinbox.HeaderScope: {m.Scope}, jsinbox.HeaderStream: {m.Stream}, jsinbox.HeaderStreamSeq: {n}, jsinbox.HeaderDelivered: {"5"},
		}}
		if _, err := js.PublishMsg(ctx, rec, jetstream.WithMsgID(m.Scope+":"+m.Stream+":"+n), jetstream.WithExpectStream(jsinbox.DeadLetterStream(m.Stream))); err != nil {
			t.Fatal(err)
		}
	}

	// Given up on, its advisory as the server stores it, no shard run
	// since: it awaits its rescue.
	cfg := s.CachedInfo().Config
	cfg.MaxAge = 0
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waiting := "awaiting-1"
	seq := publish(waiting)
	durable := m.Durable(shard.PartitionOf(waiting, m.Partitions))
	adv := fmt.Sprintf(`{"type":"io.nats.jetstream.advisory.v1.max_deliver","id":"a1","timestamp":%q,"stream":%q,"consumer":%q,"stream_seq":%d,"deliveries":5}`,
		time.Now().UTC().Format(time.RFC3339Nano), m.Stream, durable, seq)
	if _, err := js.Publish(ctx, "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+m.Stream+"."+durable, []byte(adv)); err != nil {
		t.Fatal(err)
	}

	out, err := run("verify", "-shards", file, "-json")
	var rep struct {
		AppliedOnce         int      `json:"applied_once"`
		Lost                int      `json:"lost"`
		Unexpected          int      `json:"unexpected"`
		ExpiredBeforeRescue int      `json:"expired_before_rescue"`
		ExpiredApplied      int      `json:"expired_applied"`
		AwaitingRescue      int      `json:"awaiting_rescue"`
		Warnings            []string `json:"warnings"`
	}
	if jerr := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep); jerr != nil {
		t.Fatalf("verify -shards -json: %v\n%s", jerr, out)
	}
	if cli.ExitCode(err) != 1 || rep.AppliedOnce != 1 || rep.Lost != 0 || rep.Unexpected != 0 || rep.ExpiredBeforeRescue != 1 ||
		rep.ExpiredApplied != 1 || rep.AwaitingRescue != 1 || len(rep.Warnings) != 1 {
		t.Fatalf("verify -shards: exit %d, %+v; want exit 1 for the one expired before rescue, the other found applied, one awaiting rescue, nothing lost or unexpected\n%s",
			cli.ExitCode(err), rep, out)
	}
	out, _ = run("verify", "-shards", file)
	for _, want := range []string{"awaiting rescue", "expired before rescue", "expired, found applied", "stream seq " + strconv.FormatUint(neverSeq, 10)} {
		if !strings.Contains(out, want) {
			t.Errorf("verify -shards table lacks %q:\n%s", want, out)
		}
	}
	t.Logf("verify -shards:\n%s", out)
}
