package shard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// idsOf returns k IDs of partition p among n, named after prefix.
func idsOf(prefix string, p, n, k int) []string {
	var out []string
	for i := 0; len(out) < k; i++ {
		if c := fmt.Sprintf("%s-%d", prefix, i); PartitionOf(c, n) == p {
			out = append(out, c)
		}
	}
	return out
}

// handOffEnv is two shards, a and b, with one durable each, on one
// nats-server, whose effect writes a row per message applied.
type handOffEnv struct {
	t     *testing.T
	m     Map
	pools map[string]*pgxpool.Pool
	js    jetstream.JetStream
	procs map[string]*Processor
	// stop[name] ends that shard's runner and waits for it.
	stop map[string]func()
}

func newHandOffEnv(t *testing.T, partitions int, a, b Set) *handOffEnv {
	t.Helper()
	ctx := context.Background()
	e := &handOffEnv{t: t, procs: map[string]*Processor{}, stop: map[string]func(){}}
	e.m = (&Map{Partitions: partitions, ShardDurables: true,
		Shards: []Shard{{Name: "a", DatabaseURL: "x", Partitions: a}, {Name: "b", DatabaseURL: "y", Partitions: b}}}).WithDefaults()
	e.pools = newShardPools(t, &e.m)
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e.js, _ = jetstream.New(nc)
	if err := e.m.EnsureStream(ctx, e.js, jsinbox.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if _, err := e.pools[name].Exec(ctx, `CREATE TABLE applied (id text NOT NULL, owned bool NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		inner, err := inbox.NewProcessor(pginbox.New(e.pools[name]), inbox.Handler[pgx.Tx](&Fenced{Map: &e.m, Inner: &applyRows{m: &e.m}}), inbox.Config{Scope: e.m.Scope})
		if err != nil {
			t.Fatal(err)
		}
		e.procs[name] = NewProcessor(inner, &e.m)
	}
	t.Cleanup(func() {
		for _, stop := range e.stop {
			stop()
		}
	})
	return e
}

// start runs shard name's runner until stop.
func (e *handOffEnv) start(name string) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runner{JS: e.js, Pool: e.pools[name], Map: &e.m, Name: name, Proc: e.procs[name], Poll: 200 * time.Millisecond,
		Consumer: jsinbox.ConsumerConfig{AckWait: 5 * time.Second, Nak: fastNak}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := r.Run(ctx); err != nil {
			e.t.Errorf("shard %s: %v", name, err)
		}
	}()
	e.stop[name] = func() {
		cancel()
		wg.Wait()
		delete(e.stop, name)
	}
}

func (e *handOffEnv) publish(ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		msg := &nats.Msg{Subject: PublishSubject(e.m.Subject, id, "ledger.credit"), Data: []byte("{}"), Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, id)
		if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
			e.t.Fatal(err)
		}
	}
}

// applied returns how many times each ID was applied over both shards.
func (e *handOffEnv) applied() map[string]int {
	e.t.Helper()
	out := map[string]int{}
	for _, p := range e.pools {
		rows, err := p.Query(context.Background(), `SELECT id FROM applied`)
		if err != nil {
			e.t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			e.t.Fatal(err)
		}
		for _, id := range ids {
			out[id]++
		}
	}
	return out
}

func (e *handOffEnv) side(name string) Side { return Side{name, e.pools[name]} }

// wantOnce fails the test for each of ids not applied exactly once over
// both shards.
func (e *handOffEnv) wantOnce(ids ...string) {
	e.t.Helper()
	got := e.applied()
	for _, id := range ids {
		if got[id] != 1 {
			e.t.Errorf("%s applied %d times over the shards", id, got[id])
		}
	}
}

// waitHandOffGone waits (up to two minutes) until partition p's hand-off
// durable is deleted: its target read it to the end.
func (e *handOffEnv) waitHandOffGone(p int) {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := e.js.Consumer(context.Background(), e.m.Stream, e.m.HandOff(p))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("partition %d's hand-off durable is still there after 2 minutes (%v)", p, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHandOffCoversWhatTheSourceLeft moves a partition from a shard that
// stopped before it read the partition's last messages to a shard whose
// durable had already passed them: the hand-off durable delivers them to
// the new owner. Without it (the unsafe move) they are lost, which shows
// that the test can see the loss. A second move waits for the hand-off.
func TestHandOffCoversWhatTheSourceLeft(t *testing.T) {
	for _, unsafe := range []bool{false, true} {
		t.Run(map[bool]string{false: "hand-off", true: "unsafe no hand-off"}[unsafe], func(t *testing.T) {
			ctx := context.Background()
			e, warm := newRunningPair(t)

			// a stops; partition 0's next intents wait in the stream, and
			// b's durable passes them while it reads its own partition.
			e.stop["a"]()
			left := idsOf("left", 0, 4, 20)
			e.publish(left...)
			later := idsOf("later", 2, 4, 20)
			e.publish(later...)
			e.waitApplied("b's own intents", later...)
			e.stop["b"]()

			res, err := MoveWith(ctx, &e.m, 0, e.side("a"), e.side("b"), MoveOptions{JS: e.js, UnsafeNoHandOff: unsafe})
			if err != nil || res.Already {
				t.Fatalf("move 0 a→b: %+v %v", res, err)
			}
			if !unsafe {
				if _, err := MoveWith(ctx, &e.m, 0, e.side("b"), e.side("a"), MoveOptions{JS: e.js}); !errors.Is(err, ErrHandOffRunning) {
					t.Fatalf("a move back while the hand-off runs: %v, want ErrHandOffRunning", err)
				}
			}
			e.start("b")
			marker := idsOf("marker", 0, 4, 1)
			e.publish(marker...)
			e.waitApplied("an intent of partition 0 after the move", marker...)
			if unsafe {
				got := e.applied()
				lost := 0
				for _, id := range left {
					if got[id] == 0 {
						lost++
					}
				}
				if lost == 0 {
					t.Fatal("the move without a hand-off lost nothing: this test cannot show a loss")
				}
				t.Logf("without a hand-off, %d of the %d intents the source had not read are lost", lost, len(left))
				return
			}
			e.waitApplied("the intents the source had not read", left...)
			// The hand-off ends: b's durable reads partition 0 itself.
			e.waitHandOffGone(0)
			// Now the partition moves back, and a applies what comes.
			e.start("a")
			if _, err := MoveWith(ctx, &e.m, 0, e.side("b"), e.side("a"), MoveOptions{JS: e.js}); err != nil {
				t.Fatalf("move 0 b→a after the hand-off: %v", err)
			}
			back := idsOf("back", 0, 4, 10)
			e.publish(back...)
			e.waitApplied("partition 0's intents after the move back", back...)
			all := append(append(append(append(warm, left...), later...), marker...), back...)
			time.Sleep(300 * time.Millisecond) // a second apply would show now
			e.wantOnce(all...)
		})
	}
}

// TestShardDurablesAcrossMoves runs two shards with one durable each while
// intents flow and partitions move both ways, a partition moving back as
// soon as its hand-off allows: every intent is applied exactly once, and
// no shard applies a partition it does not own in that transaction.
func TestShardDurablesAcrossMoves(t *testing.T) {
	ctx := context.Background()
	e := newHandOffEnv(t, 8, Set{0, 1, 2, 3}, Set{4, 5, 6, 7})
	e.start("a")
	e.start("b")
	const n = 600
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("intent-%d", i)
	}
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i, id := range ids {
			msg := &nats.Msg{Subject: PublishSubject(e.m.Subject, id, "ledger.credit"), Data: []byte("{}"), Header: nats.Header{}}
			msg.Header.Set(jetstream.MsgIDHeader, id)
			if _, err := e.js.PublishMsg(ctx, msg); err != nil {
				t.Error(err)
				return
			}
			if i%10 == 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	refused := 0
	for _, mv := range []struct {
		p        int
		from, to string
	}{{0, "a", "b"}, {5, "b", "a"}, {0, "b", "a"}} {
		time.Sleep(400 * time.Millisecond)
		deadline := time.Now().Add(2 * time.Minute)
		for {
			_, err := MoveWith(ctx, &e.m, mv.p, e.side(mv.from), e.side(mv.to), MoveOptions{JS: e.js})
			if err == nil {
				break
			}
			if !errors.Is(err, ErrHandOffRunning) || time.Now().After(deadline) {
				t.Fatalf("move %d %s→%s: %v", mv.p, mv.from, mv.to, err)
			}
			refused++
			time.Sleep(50 * time.Millisecond)
		}
	}
	<-published
	e.waitApplied("every intent", ids...)
	time.Sleep(500 * time.Millisecond) // the last redeliveries settle
	e.wantOnce(ids...)
	for name, p := range e.pools {
		var outside int
		if err := p.QueryRow(ctx, `SELECT count(*) FROM applied WHERE NOT owned`).Scan(&outside); err != nil || outside != 0 {
			t.Errorf("shard %s applied %d intents of partitions it did not own in that transaction (%v)", name, outside, err)
		}
	}
	for name, want := range map[string]Set{"a": {0, 1, 2, 3, 5}, "b": {4, 6, 7}} {
		if got, err := Owned(ctx, e.pools[name], e.m.Scope); err != nil || got.String() != want.String() {
			t.Errorf("shard %s owns %v (%v), want %v", name, got, err, want)
		}
	}
	t.Logf("%d intents applied once each; the move back of partition 0 waited for its hand-off %d times", len(ids), refused)
}

// TestMoveWaitsForTheSourcesRescue: a move whose source has a
// max-deliveries advisory its rescue has not settled is refused (the
// message may be the partition's, behind the hand-off's start), and goes
// through once the rescue settled it.
func TestMoveWaitsForTheSourcesRescue(t *testing.T) {
	ctx := context.Background()
	e := newHandOffEnv(t, 4, Set{0, 1}, Set{2, 3})
	subject := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + e.m.Stream + "." + e.m.ShardDurable("a")
	if _, err := e.js.Publish(ctx, subject, []byte(`{"type":"io.nats.jetstream.advisory.v1.max_deliver","stream":"`+e.m.Stream+`","consumer":"`+e.m.ShardDurable("a")+`","stream_seq":1,"deliveries":20}`)); err != nil {
		t.Fatal(err)
	}
	_, refused := MoveWith(ctx, &e.m, 0, e.side("a"), e.side("b"), MoveOptions{JS: e.js})
	if !errors.Is(refused, ErrRescuePending) {
		t.Fatalf("a move while the source's rescue has an advisory to settle: %v, want ErrRescuePending", refused)
	}
	if got, _ := Owned(ctx, e.pools["a"], e.m.Scope); got.String() != "0-1" {
		t.Fatalf("the refused move fenced the partition: a owns %v", got)
	}
	// The source's rescue settles it (here by hand).
	rc, err := e.js.CreateConsumer(ctx, jsinbox.AdvisoryStream(e.m.Stream), jetstream.ConsumerConfig{Durable: e.m.ShardDurable("a"), FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := rc.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := MoveWith(ctx, &e.m, 0, e.side("a"), e.side("b"), MoveOptions{JS: e.js}); err != nil {
		t.Fatalf("the move once the rescue settled: %v", err)
	}
	t.Logf("refused first: %v", refused)
}

// waitApplied waits (up to two minutes) until every one of ids is applied;
// on failure it says which are missing, of which partitions, and what
// every durable holds.
func (e *handOffEnv) waitApplied(what string, ids ...string) {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got := e.applied()
		var missing []string
		for _, id := range ids {
			if got[id] == 0 {
				missing = append(missing, fmt.Sprintf("%s(p%d)", id, PartitionOf(id, e.m.Partitions)))
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			ctx := context.Background()
			s, _ := e.js.Stream(ctx, e.m.Stream)
			for name := range s.ConsumerNames(ctx).Name() {
				c, err := e.js.Consumer(ctx, e.m.Stream, name)
				if err != nil {
					continue
				}
				i := c.CachedInfo()
				e.t.Logf("durable %s: filters %v %q, delivered %d, ack floor %d, pending %d, ack pending %d, redelivered %d",
					name, i.Config.FilterSubjects, i.Config.FilterSubject, i.Delivered.Stream, i.AckFloor.Stream, i.NumPending, i.NumAckPending, i.NumRedelivered)
			}
			for name, p := range e.pools {
				rows, _ := Rows(ctx, p, e.m.Scope)
				e.t.Logf("shard %s rows: %+v", name, rows)
			}
			e.t.Fatalf("%s: %d of %d not applied within 2 minutes: %v", what, len(missing), len(ids), missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newRunningPair runs shards a (partitions 0-1) and b (2-3), each with an
// intent applied (so both durables exist); it returns those intents.
func newRunningPair(t *testing.T) (*handOffEnv, []string) {
	t.Helper()
	e := newHandOffEnv(t, 4, Set{0, 1}, Set{2, 3})
	e.start("a")
	e.start("b")
	warm := append(idsOf("warm0", 0, 4, 1), idsOf("warm2", 2, 4, 1)...)
	e.publish(warm...)
	e.waitApplied("the first intents", warm...)
	return e, warm
}

// newFailedMove runs shards a (partitions 0-1) and b (2-3), applies an
// intent in each, and moves partition 0 from a to b with b's inbox
// refusing every insert (trigger "refuse"): the copy fails after the
// fence. It returns the intents applied first.
func newFailedMove(t *testing.T) (*handOffEnv, []string) {
	t.Helper()
	ctx := context.Background()
	e, warm := newRunningPair(t)
	if _, err := e.pools["b"].Exec(ctx, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'disk full'; END $$;
CREATE TRIGGER refuse BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	if _, err := MoveWith(ctx, &e.m, 0, e.side("a"), e.side("b"), MoveOptions{JS: e.js}); err == nil {
		t.Fatal("the move with a failing copy succeeded")
	}
	return e, warm
}

// TestUnfenceReadsTheHandOff: a move whose copy fails leaves the partition
// fenced at its source, which acks what still reaches it of the partition
// unapplied, for the hand-off. Given back, the source reads the hand-off
// itself: nothing it acked there is lost, and the hand-off ends.
func TestUnfenceReadsTheHandOff(t *testing.T) {
	ctx := context.Background()
	e, warm := newFailedMove(t)
	// Fenced at a, taken by nobody: a acks these unapplied, for the
	// hand-off, once its runner has read its row.
	during := idsOf("during", 0, 4, 10)
	e.publish(during...)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		c, err := e.js.Consumer(ctx, e.m.Stream, e.m.ShardDurable("a"))
		// Nothing left for a's durable: what it got of them it acked (its
		// filter may have dropped the partition before the rest came).
		if err == nil && c.CachedInfo().NumAckPending == 0 && c.CachedInfo().NumPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's durable did not settle the fenced partition's intents within 2 minutes (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := e.applied(); got[during[0]] != 0 {
		t.Fatalf("%s applied while its partition was fenced", during[0])
	}
	if _, err := UnfenceWith(ctx, &e.m, 0, e.side("a"), e.side("b"), MoveOptions{JS: e.js}); err != nil {
		t.Fatal(err)
	}
	e.waitApplied("the intents a acked for the hand-off", during...)
	e.waitHandOffGone(0)
	e.wantOnce(append(warm, during...)...)
}

// TestProcessorAfterAHandOff: a shard that gave a partition away with a
// hand-off from sequence 100 acks, unapplied, what reaches it of the
// partition from there (the hand-off delivers it to the owner), and
// dead-letters with the way to the owner an earlier one (only a late
// rescue brings it): neither is retried for ever. The hand-off's own
// processor never acks unapplied.
func TestProcessorAfterAHandOff(t *testing.T) {
	m := (&Map{Partitions: 4, Shards: []Shard{{Name: "a", DatabaseURL: "x", Partitions: Set{0, 1, 2, 3}}}}).WithDefaults()
	inner := &fakeProc{}
	p := NewProcessor(inner, &m)
	p.SetOwned(Set{1, 2, 3})
	p.SetHandedOff([]uint64{100, 0, 0, 0})
	id := idOf(0, 4)
	msg := func(seq uint64) inbox.Message {
		return inbox.Message{ID: id, Payload: []byte("{}"), Subject: StoredSubject(m.Subject, id, "ledger.1", 4), StreamSeq: seq}
	}
	out, err := p.Process(context.Background(), []inbox.Message{msg(100), msg(99)})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Status != inbox.StatusDuplicate {
		t.Errorf("at the hand-off's start: %v (%s), want acked unapplied", out[0].Status, out[0].Reason)
	}
	if out[1].Status != inbox.StatusRejected || !strings.Contains(out[1].Reason, "re-drive") {
		t.Errorf("before the hand-off's start: %v (%s), want dead-lettered with the way to the owner", out[1].Status, out[1].Reason)
	}
	out, err = p.HandOffProcessor().Process(context.Background(), []inbox.Message{msg(100)})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Status != inbox.StatusRetry {
		t.Errorf("through the hand-off's processor: %v, want a retry (never acked unapplied)", out[0].Status)
	}
	if len(inner.got) != 0 {
		t.Errorf("the inner processor saw %d messages of a partition not owned", len(inner.got))
	}
}

// TestGiveBackDuringARerun: a move whose copy failed is run again, and
// while it prepares the partition is given back to its source: the re-run
// must not fence and take it (it would leave the hand-off, now the
// source's, read by nobody). The source reads the hand-off itself, and
// what it acked there unapplied is applied once.
func TestGiveBackDuringARerun(t *testing.T) {
	ctx := context.Background()
	e, warm := newFailedMove(t)
	during := idsOf("during", 0, 4, 10)
	e.publish(during...)
	if _, err := e.pools["b"].Exec(ctx, `DROP TRIGGER refuse ON inbox`); err != nil {
		t.Fatal(err)
	}
	var gaveBack error
	_, err := MoveWith(ctx, &e.m, 0, e.side("a"), e.side("b"), MoveOptions{JS: e.js, beforeFence: func() {
		_, gaveBack = UnfenceWith(ctx, &e.m, 0, e.side("a"), e.side("b"), MoveOptions{JS: e.js})
	}})
	if gaveBack != nil {
		t.Fatal(gaveBack)
	}
	if err == nil {
		t.Fatal("the re-run fenced and took a partition given back meanwhile")
	}
	t.Logf("the re-run: %v", err)
	for name, want := range map[string]Set{"a": {0, 1}, "b": {2, 3}} {
		if got, err := Owned(ctx, e.pools[name], e.m.Scope); err != nil || got.String() != want.String() {
			t.Errorf("shard %s owns %v (%v), want %v", name, got, err, want)
		}
	}
	e.waitApplied("the intents a acked for the hand-off", during...)
	e.waitHandOffGone(0)
	e.wantOnce(append(warm, during...)...)
}

// TestRerunAfterAnUnfinishedGiveBack: a give-back that handed the hand-off
// to the source but did not commit leaves the partition fenced with a
// hand-off nobody reads; the move run again hands it back to its target,
// which reads it: nothing the source acked there is lost.
func TestRerunAfterAnUnfinishedGiveBack(t *testing.T) {
	ctx := context.Background()
	e, warm := newFailedMove(t)
	during := idsOf("during", 0, 4, 10)
	e.publish(during...)
	if err := retargetHandOff(ctx, &e.m, e.js, 0, "a"); err != nil { // the give-back's first step only
		t.Fatal(err)
	}
	if _, err := e.pools["b"].Exec(ctx, `DROP TRIGGER refuse ON inbox`); err != nil {
		t.Fatal(err)
	}
	if _, err := MoveWith(ctx, &e.m, 0, e.side("a"), e.side("b"), MoveOptions{JS: e.js}); err != nil {
		t.Fatalf("the move run again: %v", err)
	}
	e.waitApplied("the intents a acked for the hand-off", during...)
	e.waitHandOffGone(0)
	e.wantOnce(append(warm, during...)...)
}
