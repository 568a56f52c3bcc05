package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestShardedCommands runs a sharded stream the way an operator does,
// through the commands: the stream, each shard migrated and consuming in
// its own consumer command, a partition moved while they run, a copy
// published under another ID's key dead-lettered and re-driven on its own,
// and verify -shards over all shards; then breaks the end state to see
// verify -shards go red.
func TestShardedCommands(t *testing.T) {
	for _, sd := range []bool{false, true} {
		t.Run(map[bool]string{false: "a durable per partition", true: "a durable per shard"}[sd], func(t *testing.T) { testShardedCommands(t, sd) })
	}
}

func testShardedCommands(t *testing.T, shardDurables bool) {
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	urls := map[string]string{}
	m := shard.Map{Partitions: 8, ShardDurables: shardDurables}
	for i, name := range []string{"a", "b", "c"} {
		urls[name] = testenv.NewDatabase(t)
		set, _ := shard.ParseSet([]string{"0-2", "3-5", "6-7"}[i])
		m.Shards = append(m.Shards, shard.Shard{Name: name, DatabaseURLEnv: "SHARD_" + strings.ToUpper(name) + "_URL", Partitions: set})
	}
	file := filepath.Join(t.TempDir(), "shards.json")
	m = m.WithDefaults()
	if err := m.Save(file); err != nil {
		t.Fatal(err)
	}
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "SHARD_A_URL": urls["a"], "SHARD_B_URL": urls["b"], "SHARD_C_URL": urls["c"]})
	ctx := context.Background()
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := Jetinbox(ctx, args, env, nil, &out, &errOut)
		return out.String() + errOut.String(), err
	}
	mustRun := func(args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return out
	}
	mustRun("partitions", "stream", "-shards", file, "-duplicate-window", "1s")
	for _, name := range []string{"a", "b", "c"} {
		mustRun("migrate", "-shards", file, "-shard", name)
		mustRun("accounts", "-open", "1-16", "-database-url", urls[name])
	}
	mustRun("partitions", "list", "-shards", file)

	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cli.Consumer(cctx, []string{"-shards", file, "-shard", name, "-http", "", "-batch", "100", "-inflight", "1"}, env, io.Discard, io.Discard); err != nil {
				t.Errorf("consumer %s: %v", name, err)
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	publish := func(id, subject string) {
		t.Helper()
		payload := fmt.Sprintf(`{"account":%d,"amount":5}`, 1+len(id)%16)
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte(payload), Header: nats.Header{jetstream.MsgIDHeader: {id}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 300 {
		id := fmt.Sprintf("o-%d", i)
		publish(id, shard.PublishSubject(m.Subject, id, "ledger.1"))
	}
	// Move a partition of a to c while the three run and intents flow.
	moved := m.Shards[0].Partitions[1]
	out := mustRun("partitions", "move", fmt.Sprint(moved), "--to", "c", "-shards", file)
	t.Log(out)
	for i := 300; i < 600; i++ {
		id := fmt.Sprintf("o-%d", i)
		publish(id, shard.PublishSubject(m.Subject, id, "ledger.1"))
	}
	// A copy keyed by another ID: refused by the shard that gets it.
	publish("stray-1", shard.PublishSubject(m.Subject, "not-stray-1", "ledger.1"))

	waitVerify := func() string {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			out, err := run("verify", "-shards", file)
			if err == nil {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("verify -shards never clean: %v\n%s", err, out)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	if out := waitVerify(); !strings.Contains(out, "dead-lettered     1") {
		t.Logf("verify:\n%s", out)
	}
	// Wait for the dead letter, then re-drive it through the map.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(mustRun("dlq", "-shards", file), "stray-1") {
		if time.Now().After(deadline) {
			t.Fatal("the stray was not dead-lettered")
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // past the duplicate window
	if out := mustRun("dlq", "-shards", file, "-redrive", "-id", "stray-1"); !strings.Contains(out, "re-driven 1") {
		t.Fatalf("dlq -redrive:\n%s", out)
	}
	out = waitVerify()
	t.Logf("verify -shards:\n%s", out)
	for _, want := range []string{"applied once  601", "in two shards    0 ok", "lost    0 ok"} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), strings.Join(strings.Fields(want), " ")) {
			t.Errorf("verify -shards lacks %q", want)
		}
	}
	nm, err := shard.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if nm.Owner(moved) != "c" {
		t.Errorf("the map file gives partition %d to %q after the move", moved, nm.Owner(moved))
	}
	durable := fmt.Sprintf("ledger_p%02d", moved)
	if shardDurables {
		durable = "ledger_s_c"
	}
	if out := mustRun("partitions", "list", "-v", "-shards", file); !strings.Contains(strings.Join(strings.Fields(out), " "), fmt.Sprintf("%d %s pintents.%d.> c c", moved, durable, moved)) {
		t.Errorf("partitions list -v does not show partition %d at c in both:\n%s", moved, out)
	}
	// A replay of each shard: its partitions only, every message a
	// duplicate (the misbound copy is rejected again, with no row).
	replayed := 0
	for _, name := range []string{"a", "b", "c"} {
		out, err := run("replay", "-shards", file, "-shard", name)
		if err != nil {
			t.Fatalf("replay -shard %s: %v\n%s", name, err, out)
		}
		var n int
		if _, err := fmt.Sscanf(out, "replayed %d messages", &n); err != nil {
			t.Fatalf("replay -shard %s: %v\n%s", name, err, out)
		}
		replayed += n
	}
	if replayed != 602 {
		t.Errorf("the shards' replays read %d messages, want the stream's 602, each in one shard", replayed)
	}
	// Prune per shard reads the partition durables' horizon: a week is
	// inside the stream's, so it refuses.
	if out, err := run("prune", "-shards", file, "-shard", "a", "-older-than", "1h"); err == nil || !strings.Contains(out+err.Error(), "horizon") {
		t.Errorf("prune -shard a -older-than 1h: %v\n%s", err, out)
	} else {
		t.Logf("prune -shard a: %v", err)
	}
	stop()
	wg.Wait()

	// verify -shards must see an ID applied in two shards, and a lost one.
	var id string
	pa, _ := pgxpool.New(ctx, urls["a"])
	defer pa.Close()
	pc, _ := pgxpool.New(ctx, urls["c"])
	defer pc.Close()
	if err := pa.QueryRow(ctx, `SELECT message_id FROM ledger_entries LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Exec(ctx, `INSERT INTO ledger_entries (scope, message_id, account, amount) VALUES ('ledger', $1, 1, 0)`, id); err != nil {
		t.Fatal(err)
	}
	out, err = run("verify", "-shards", file, "-json")
	var rep struct {
		InTwoShards int `json:"in_two_shards"`
	}
	_ = json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep)
	if cli.ExitCode(err) != 1 || rep.InTwoShards != 1 {
		t.Errorf("an ID applied in two shards: verify exit %d, in two shards %d\n%s", cli.ExitCode(err), rep.InTwoShards, out)
	}
	if _, err := pc.Exec(ctx, `DELETE FROM ledger_entries WHERE message_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := pa.Exec(ctx, `DELETE FROM ledger_entries WHERE message_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if out, err := run("verify", "-shards", file); cli.ExitCode(err) != 1 || !strings.Contains(out, "lost: "+id) {
		t.Errorf("an ID applied nowhere: verify exit %d\n%s", cli.ExitCode(err), out)
	}
	// ... and a partial balance that its entries do not add up to.
	if _, err := pc.Exec(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = 2`); err != nil {
		t.Fatal(err)
	}
	if out, err := run("verify", "-shards", file); cli.ExitCode(err) != 1 || !strings.Contains(out, "balance: account 2") {
		t.Errorf("a partial balance off by one: verify exit %d\n%s", cli.ExitCode(err), out)
	}
	_ = os.Remove(file)
}
