package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
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

// shardedFixture is two shards, a (partitions 0-1) and b (2-3), migrated,
// with accounts, and the stream with its transform.
type shardedFixture struct {
	file string
	m    shard.Map
	urls map[string]string
	env  cli.Env
	js   jetstream.JetStream
}

func newShardedFixture(t *testing.T) *shardedFixture {
	t.Helper()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	f := &shardedFixture{urls: map[string]string{}, file: filepath.Join(t.TempDir(), "shards.json")}
	f.m = shard.Map{Partitions: 4}
	for i, name := range []string{"a", "b"} {
		f.urls[name] = testenv.NewDatabase(t)
		set, _ := shard.ParseSet([]string{"0-1", "2-3"}[i])
		f.m.Shards = append(f.m.Shards, shard.Shard{Name: name, DatabaseURLEnv: "SHARD_" + strings.ToUpper(name) + "_URL", Partitions: set})
	}
	f.m = f.m.WithDefaults()
	if err := f.m.Save(f.file); err != nil {
		t.Fatal(err)
	}
	f.env = mapEnv(map[string]string{"NATS_URL": srv.URL(), "SHARD_A_URL": f.urls["a"], "SHARD_B_URL": f.urls["b"]})
	f.must(t, "partitions", "stream", "-shards", f.file)
	for _, name := range []string{"a", "b"} {
		f.must(t, "migrate", "-shards", f.file, "-shard", name)
		f.must(t, "accounts", "-open", "1-4", "-database-url", f.urls[name])
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f.js, _ = jetstream.New(nc)
	return f
}

func (f *shardedFixture) run(args ...string) (string, error) {
	var out bytes.Buffer
	err := Jetinbox(context.Background(), args, f.env, nil, &out, &out)
	return out.String(), err
}

func (f *shardedFixture) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := f.run(args...)
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return out
}

// ledgerIDs returns the IDs the shard's ledger holds an entry of.
func (f *shardedFixture) ledgerIDs(t *testing.T, name string) map[string]bool {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, f.urls[name])
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT DISTINCT message_id FROM ledger_entries`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ids := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[id] = true
	}
	return ids
}

// TestReplayShardsDuringMove replays shard a's partitions with -apply while
// partition 0 moves to b after the first batch, then replays b: every ID
// must be applied in one shard. The plain processor with the owned set read
// at start (the old replay) goes on applying partition 0 in a after the
// copy, and b applies those IDs again.
func TestReplayShardsDuringMove(t *testing.T) {
	for _, c := range []struct {
		name   string
		unsafe bool
	}{{"fenced", false}, {"plain processor (unsafe)", true}} {
		t.Run(c.name, func(t *testing.T) {
			f := newShardedFixture(t)
			ctx := context.Background()
			var ids []string
			for i := 0; len(ids) < 120; i++ {
				if id := fmt.Sprintf("r-%d", i); shard.PartitionOf(id, f.m.Partitions) == 0 {
					ids = append(ids, id)
				}
			}
			for _, id := range ids {
				if _, err := f.js.PublishMsg(ctx, &nats.Msg{Subject: shard.PublishSubject(f.m.Subject, id, "ledger.1"), Data: []byte(`{"account":1,"amount":5}`),
					Header: nats.Header{jetstream.MsgIDHeader: {id}}}); err != nil {
					t.Fatal(err)
				}
			}
			var once sync.Once
			afterReplayBatch = func(uint64) {
				once.Do(func() { f.must(t, "partitions", "move", "0", "--to", "b", "-shards", f.file) })
			}
			unsafeReplayPlainProcessor = c.unsafe
			defer func() { afterReplayBatch, unsafeReplayPlainProcessor = nil, false }()
			// Both replays apply what no inbox had: exit 1 by design.
			out, err := f.run("replay", "-shards", f.file, "-shard", "a", "-apply", "-batch", "20")
			t.Logf("replay of a (exit %d):\n%s", cli.ExitCode(err), out)
			afterReplayBatch = nil
			out, err = f.run("replay", "-shards", f.file, "-shard", "b", "-apply", "-batch", "20")
			t.Logf("replay of b (exit %d):\n%s", cli.ExitCode(err), out)
			a, b := f.ledgerIDs(t, "a"), f.ledgerIDs(t, "b")
			both, none := 0, 0
			for _, id := range ids {
				switch {
				case a[id] && b[id]:
					both++
				case !a[id] && !b[id]:
					none++
				}
			}
			t.Logf("%d IDs: %d applied in a, %d in b, %d in both, %d in none", len(ids), len(a), len(b), both, none)
			switch {
			case c.unsafe && both == 0:
				t.Errorf("the plain processor's replay applied no ID in two shards: the test does not show the hole")
			case !c.unsafe && (both != 0 || none != 0):
				t.Errorf("a replay during a move: %d IDs applied in two shards, %d in none; want 0 and 0", both, none)
			}
		})
	}
}

// TestShardDatabaseRefusedWithoutShards: a consumer or replay pointed at a
// shard's database without -shards is refused at start (exit 2), saying
// what to pass: it would apply every partition, outside the fence.
func TestShardDatabaseRefusedWithoutShards(t *testing.T) {
	f := newShardedFixture(t)
	for _, args := range [][]string{
		{"replay", "-database-url", f.urls["a"], "-stream", f.m.Stream, "-scope", f.m.Scope},
		{"replay", "-database-url", f.urls["a"], "-stream", f.m.Stream, "-scope", f.m.Scope, "-apply"},
	} {
		out, err := f.run(args...)
		if cli.ExitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), "-shards FILE -shard NAME") {
			t.Errorf("%v: exit %d (%v)\n%s; want 2 and what to pass", args, cli.ExitCode(err), err, out)
		}
	}
	var stderr bytes.Buffer
	// Refused at start; a consumer that runs instead stops after a while.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := cli.Consumer(ctx, []string{"-database-url", f.urls["b"], "-stream", f.m.Stream, "-scope", f.m.Scope, "-durable", "ledger_p02", "-http", ""}, f.env, io.Discard, &stderr)
	if cli.ExitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), "-shards FILE -shard NAME") {
		t.Errorf("consumer without -shards on a shard's database: exit %d (%v)\n%s; want 2 and what to pass", cli.ExitCode(err), err, stderr.String())
	}
	// Another scope on the same database is not a shard's.
	out, err := f.run("replay", "-database-url", f.urls["a"], "-stream", f.m.Stream, "-scope", "other")
	if strings.Contains(fmt.Sprint(err), "-shards FILE") {
		t.Errorf("replay of another scope refused as a shard's: %v\n%s", err, out)
	}
}

// TestPartitionsMoveBackAfterFailedCopy: a move whose copy fails after the
// fence leaves the partition owned by no shard; partitions list names the
// move to finish, and a move back to the source gives it back.
func TestPartitionsMoveBackAfterFailedCopy(t *testing.T) {
	f := newShardedFixture(t)
	ctx := context.Background()
	pools := map[string]*pgxpool.Pool{}
	for _, n := range []string{"a", "b"} {
		p, err := pgxpool.New(ctx, f.urls[n])
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pools[n] = p
	}
	id := ""
	for i := 0; id == ""; i++ {
		if c := fmt.Sprintf("m-%d", i); shard.PartitionOf(c, f.m.Partitions) == 0 {
			id = c
		}
	}
	if _, err := pools["a"].Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint, status, stream_seq, subject, received_at) VALUES ($1, $2, '\x01', 'applied', 1, 's', now())`, f.m.Scope, id); err != nil {
		t.Fatal(err)
	}
	if _, err := pools["b"].Exec(ctx, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'disk full'; END $$;
CREATE TRIGGER refuse BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	if out, err := f.run("partitions", "move", "0", "--to", "b", "-shards", f.file); err == nil || !strings.Contains(fmt.Sprint(err), "disk full") {
		t.Fatalf("the move with a failing copy: %v\n%s", err, out)
	}
	out, err := f.run("partitions", "list", "-shards", f.file)
	if cli.ExitCode(err) != 1 || !strings.Contains(out, "run: jetinbox partitions move 0 --to b") {
		t.Errorf("partitions list after a failed copy: exit %d\n%s\nwant exit 1 and the move to finish", cli.ExitCode(err), out)
	}
	out = f.must(t, "partitions", "move", "0", "--to", "a", "-shards", f.file)
	t.Log(out)
	f.must(t, "partitions", "list", "-shards", f.file)
	for n, want := range map[string]string{"a": "0-1", "b": "2-3"} {
		if o, err := shard.Owned(ctx, pools[n], f.m.Scope); err != nil || o.String() != want {
			t.Errorf("shard %s owns %v (%v), want %s", n, o, err, want)
		}
	}
}
