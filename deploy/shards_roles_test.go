package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// shardEnv runs the project's binaries against a partitioned stream on the
// shipped cluster: every command under the NATS user and database role
// deploy/README.md gives it, with the shipped map file (a copy: a move
// rewrites it) and a PostgreSQL server per shard, as a shard is a primary
// of its own.
type shardEnv struct {
	ctx      context.Context
	fx       *secretsFixture
	urls     string
	pgs      map[string]*postgresServer // by shard
	bin, dir string
	mapFile  string
	m        *shard.Map
	pgpass   map[string]string // role -> pgpass file
	pw       map[string]string // role -> password
}

// dbURL is shard s's database as role sees it.
func (e *shardEnv) dbURL(s, role string) string {
	pg := e.pgs[s]
	return fmt.Sprintf("postgres://%s@localhost:%d/jetinbox?sslmode=verify-full&sslrootcert=%s", role, pg.port, url.QueryEscape(pg.ca))
}

// env is a command's environment: natsUser's credentials and reply prefix
// ("" for none), and every shard's database URL as dbRole ("" for none).
func (e *shardEnv) env(natsUser, dbRole string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "JETINBOX_") || strings.HasPrefix(k, "SHARD_") || k == "DATABASE_URL" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "JETINBOX_LOG_FORMAT=text", "JETINBOX_HTTP_ADDR=")
	if natsUser != "" {
		tls := filepath.Join(e.fx.dir, "tls")
		env = append(env, "NATS_URL="+e.urls,
			"NATS_NKEY="+filepath.Join(e.fx.dir, "nkeys", natsUser+".nk"),
			"NATS_CERT="+filepath.Join(tls, natsUser+".pem"),
			"NATS_KEY="+filepath.Join(tls, natsUser+"-key.pem"),
			"NATS_CA="+filepath.Join(tls, "ca.pem"))
		if p := inboxPrefix[natsUser]; p != "" {
			env = append(env, "NATS_INBOX_PREFIX="+p)
		}
	}
	if dbRole != "" {
		for _, s := range e.m.Shards {
			env = append(env, s.DatabaseURLEnv+"="+e.dbURL(s.Name, dbRole))
		}
		env = append(env, "PGPASSFILE="+e.pgpass[dbRole])
	}
	return env
}

// run runs one command to its end and returns its standard output; it
// fails the test on a non-zero exit, or if the command's log says the
// server refused it something.
func (e *shardEnv) run(t *testing.T, natsUser, dbRole string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(e.bin, args[0]), args[1:]...)
	cmd.Dir, cmd.Env = e.dir, e.env(natsUser, dbRole)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s (NATS user %q, database role %q): %v\n%s%s", strings.Join(args, " "), natsUser, dbRole, err, out, stderr.String())
	}
	if violation(stderr.String()) {
		t.Errorf("%s (NATS user %q) was refused something:\n%s", strings.Join(args, " "), natsUser, stderr.String())
	}
	return string(out)
}

// violation reports whether a log tells of a permissions violation.
func violation(log string) bool {
	return strings.Contains(strings.ToLower(log), "permissions violation")
}

// shardProc is a consumer process of one shard.
type shardProc struct {
	name string
	cmd  *exec.Cmd
	out  *testenv.SyncBuffer
	done chan error
}

// startShards starts `jetinbox consumer -shards FILE -shard NAME` for every
// shard, as the consumer user and jetinbox_consumer.
func (e *shardEnv) startShards(t *testing.T) []*shardProc {
	t.Helper()
	var ps []*shardProc
	for _, s := range e.m.Shards {
		p := &shardProc{name: s.Name, out: &testenv.SyncBuffer{}, done: make(chan error, 1)}
		p.cmd = exec.Command(filepath.Join(e.bin, "jetinbox"), "consumer", "-shards", e.mapFile, "-shard", s.Name, "-http", "")
		p.cmd.Dir, p.cmd.Env = e.dir, e.env("consumer", "jetinbox_consumer")
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.done <- p.cmd.Wait() }()
		t.Cleanup(func() {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
			}
			if t.Failed() {
				t.Logf("shard %s consumer:\n%s", p.name, lastOutputLines(p.out.String(), 40))
			}
		})
		ps = append(ps, p)
	}
	return ps
}

// stopShards sends SIGTERM to every shard's consumer: each must drain and
// exit 0.
func (e *shardEnv) stopShards(t *testing.T, ps []*shardProc) {
	t.Helper()
	for _, p := range ps {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range ps {
		select {
		case err := <-p.done:
			if err != nil {
				t.Fatalf("shard %s consumer after SIGTERM: %v\n%s", p.name, err, lastOutputLines(p.out.String(), 40))
			}
		case <-time.After(time.Minute):
			t.Fatalf("shard %s consumer did not drain within a minute of SIGTERM", p.name)
		}
		if violation(p.out.String()) {
			t.Errorf("shard %s consumer was refused something:\n%s", p.name, lastOutputLines(p.out.String(), 40))
		}
	}
}

// settled waits until the shard databases together hold inbox rows of want
// message IDs (applied or rejected; a moved partition's rows are in its old
// shard too), read as jetinbox_verifier. It makes no NATS call, so that a
// recording running meanwhile sees the consumers alone. A row of an ID in
// never (a message whose binding check must reject it before the inbox)
// fails the test at once.
func (e *shardEnv) settled(t *testing.T, pools map[string]*pgxpool.Pool, want int, never []string) {
	t.Helper()
	eventually(t, e.ctx, func() error {
		ids := map[string]bool{}
		var bad []string
		for name, p := range pools {
			rows, err := p.Query(e.ctx, `SELECT message_id, status FROM inbox WHERE scope = $1`, e.m.Scope)
			if err != nil {
				return err
			}
			for rows.Next() {
				var id, status string
				if err := rows.Scan(&id, &status); err != nil {
					return err
				}
				if slices.Contains(never, id) {
					bad = append(bad, fmt.Sprintf("%s in shard %s (%s)", id, name, status))
				}
				ids[id] = true
			}
			if err := rows.Err(); err != nil {
				return err
			}
		}
		if len(bad) > 0 { // after the rows are read: the pool gets its connection back
			t.Fatalf("inbox rows of %v: claimed in a partition that is not their ID's", bad)
		}
		if len(ids) != want {
			return fmt.Errorf("inbox rows of %d IDs over the shards, want %d", len(ids), want)
		}
		return nil
	})
}

// TestShardsUnderShippedRoles runs the sharded deployment of deploy/README.md
// ("Sharding") with the project's own binaries, each under the NATS user and
// database role the README gives it, on the shipped R3 cluster (deploy/nats,
// the shipped auth.conf) and a PostgreSQL database per shard set up from
// deploy/postgres (roles.sql, migrate -shards, grants.sql, shard-grants.sql):
//
//   - the admin creates the streams (`jetinbox partitions stream`) and the
//     partition durables and rescue durables from the two templates;
//   - the producer (`producer -shards`) publishes generated load and JSONL
//     with a retry, which it reads back as a duplicate, not a conflict; its
//     key's attempts to pick a partition (a partition number in the key
//     token, another ID's key) are stored where the transform says and
//     dead-lettered by the binding check; what it may not publish (dead
//     letters, advisories, a subject without a kind) is refused;
//   - a consumer per shard (`jetinbox consumer -shards FILE -shard NAME`)
//     applies its partitions, dead-letters the spoofed messages and rescues
//     one the server gave up on while no consumer ran, then stops on
//     SIGTERM;
//   - `jetinbox partitions move` (as jetinbox_migrator: a move touches the
//     databases only) gives a partition to another shard while the
//     consumers run, and what is published on it afterwards is applied
//     there;
//   - `jetinbox verify -shards` under the verifier's user and role finds
//     every ID applied once in one shard or dead-lettered.
//
// An admin subscription records what the producer, the consumers and the
// verifier publish: every subject of their partitioned-stream permissions
// must be used, and nothing else. The streams are made with one replica
// (permissions do not depend on it) to keep 128 durables cheap.
func TestShardsUnderShippedRoles(t *testing.T) {
	t.Parallel()
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fsys := loadFiles(t)
	fx := fixture(t)
	d, err := loadShardDefs(fsys)
	if err != nil {
		t.Fatal(err)
	}
	e := &shardEnv{ctx: ctx, fx: fx, dir: t.TempDir(), pgpass: map[string]string{}, pw: map[string]string{}}
	e.bin = filepath.Join(e.dir, "bin")
	build := exec.CommandContext(ctx, "go", "build", "-o", e.bin+"/", "./cmd/jetinbox", "./cmd/producer")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	e.mapFile = filepath.Join(e.dir, "shards.json")
	if err := os.WriteFile(e.mapFile, fsys["sharding/shards.json"], 0o600); err != nil {
		t.Fatal(err)
	}
	e.m = d.m

	// A PostgreSQL per shard, each set up as the README says.
	e.pgs = map[string]*postgresServer{}
	for _, role := range dbRoles {
		e.pw[role] = strings.TrimPrefix(role, "jetinbox_") + "-pw"
	}
	for _, s := range e.m.Shards {
		pg := startPostgres(t, fx)
		e.pgs[s.Name] = pg
		pg.superuser(t, "postgres", "CREATE DATABASE jetinbox")
		pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
		for _, role := range dbRoles {
			pg.superuser(t, "jetinbox", fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, e.pw[role]))
		}
	}
	for _, role := range dbRoles {
		e.pgpass[role] = filepath.Join(e.dir, role+".pgpass")
		line := fmt.Sprintf("localhost:*:jetinbox:%s:%s\n", role, e.pw[role])
		if err := os.WriteFile(e.pgpass[role], []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range e.m.Shards {
		e.run(t, "", "jetinbox_migrator", "jetinbox", "migrate", "-shards", e.mapFile, "-shard", s.Name)
		for _, f := range []string{"postgres/grants.sql", "postgres/shard-grants.sql"} {
			e.pgs[s.Name].as("jetinbox_migrator", e.pw["jetinbox_migrator"]).mustFile(t, f)
		}
		e.run(t, "", "jetinbox_migrator", "jetinbox", "accounts", "-open", "1-16", "-database-url", e.dbURL(s.Name, "jetinbox_migrator"))
	}
	pools := map[string]*pgxpool.Pool{}
	for _, s := range e.m.Shards {
		p, err := pgxpool.New(ctx, e.dbURL(s.Name, "jetinbox_verifier")+"&password="+e.pw["jetinbox_verifier"])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pools[s.Name] = p
	}

	// NATS: the shipped cluster; the admin makes the streams and, from the
	// templates, every partition's durable and rescue durable.
	e.urls = startNATSCluster(t, fsys, fx)
	one, _, _ := strings.Cut(e.urls, ",")
	e.urls = one // every client on one server: a recording sees all once flushed
	admin := connectAs(t, one, fx, "admin")
	adminJS, err := jetstream.New(admin.nc)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, func() error {
		cmd := exec.CommandContext(ctx, filepath.Join(e.bin, "jetinbox"), "partitions", "stream", "-shards", e.mapFile, "-replicas", "1")
		cmd.Env = e.env("admin", "")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("partitions stream: %v: %s", err, out) // the meta group may not have formed yet
		}
		return nil
	})
	for p := range e.m.Partitions {
		pc, rc := d.partition, d.rescue
		pc.Name, pc.Durable, pc.FilterSubject, pc.Replicas = e.m.Durable(p), e.m.Durable(p), e.m.Filter(p), 1
		rc.Name, rc.Durable, rc.FilterSubject, rc.Replicas = e.m.Durable(p), e.m.Durable(p), maxDeliveriesSubject(e.m.Stream, e.m.Durable(p)), 1
		if _, err := adminJS.CreateConsumer(ctx, d.advisories.Name, rc); err != nil {
			t.Fatalf("rescue durable %s: %v", rc.Durable, err)
		}
		if _, err := adminJS.CreateConsumer(ctx, d.stream.Name, pc); err != nil {
			t.Fatalf("durable %s: %v", pc.Durable, err)
		}
	}
	t.Logf("binaries, databases, streams and %d durables ready in %v", 2*e.m.Partitions, time.Since(started).Round(time.Millisecond))

	// The server gives up on an intent while no consumer runs: the admin
	// takes each of its deliveries and naks it; the advisory stream keeps
	// the advisory for the shard that owns the partition.
	givenUp := "given-up"
	gp := shard.PartitionOf(givenUp, e.m.Partitions)
	givenUpAck, err := adminJS.Publish(ctx, shard.PublishSubject(e.m.Subject, givenUp, "ledger.2"), []byte(`{"account":2,"amount":7}`), jetstream.WithMsgID(givenUp))
	if err != nil {
		t.Fatal(err)
	}
	dur, err := adminJS.Consumer(ctx, d.stream.Name, e.m.Durable(gp))
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= d.partition.MaxDeliver; n++ {
		m := fetchOne(t, dur, 5*time.Second)
		if m == nil {
			t.Fatalf("delivery %d of %d did not come", n, d.partition.MaxDeliver)
		}
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
	}
	if m := fetchOne(t, dur, time.Second); m != nil {
		t.Fatal("delivered after max_deliver")
	}
	eventually(t, ctx, func() error {
		s, err := adminJS.Stream(ctx, d.advisories.Name)
		if err == nil && s.CachedInfo().State.Msgs != 1 {
			err = fmt.Errorf("%s holds %d advisories, want 1", d.advisories.Name, s.CachedInfo().State.Msgs)
		}
		return err
	})

	const generated = 150
	var spoofed []string
	t.Run("producer", func(t *testing.T) {
		rec := startRecording(t, admin.nc)
		jsonl := filepath.Join(e.dir, "intents.jsonl")
		// A retry (same ID, same payload): the stream answers duplicate,
		// the producer reads the stored copy back, under the subject the
		// transform stored it, and finds it the same.
		line := `{"id":"jsonl-1","subject":"pintents.ledger.3","payload":{"account":3,"amount":30}}`
		if err := os.WriteFile(jsonl, []byte(line+"\n"+line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		out := e.run(t, "producer", "", "producer", "-shards", e.mapFile, "-input", "intents.jsonl", "-batch", "1")
		if !strings.Contains(out, "published 2 ") || !strings.Contains(out, "server-side duplicates 1") || !strings.Contains(out, "conflicts 0") {
			t.Fatalf("producer -input: want 2 published, one of them a duplicate, no conflict:\n%s", out)
		}
		out = e.run(t, "producer", "", "producer", "-shards", e.mapFile, "-count", fmt.Sprint(generated), "-accounts", "16", "-prefix", "gen")
		if !strings.Contains(out, fmt.Sprintf("published %d ", generated)) {
			t.Fatalf("producer: %s", out)
		}

		// The producer's key tries to choose the partition. The transform
		// applies to everything it may publish, so the partition token is
		// the server's; what it chooses is the key token, and a key that is
		// not the ID's is dead-lettered by every shard.
		producer := connectAs(t, one, fx, "producer")
		js, err := jetstream.New(producer.nc)
		if err != nil {
			t.Fatal(err)
		}
		for id, subj := range map[string]string{
			// A partition number where the key goes, as in a stored subject.
			"spoof-partition": e.m.Subject + ".7." + shard.Key("spoof-partition") + ".ledger.1",
			// Another ID's key: its partition, not this ID's.
			"spoof-key": shard.PublishSubject(e.m.Subject, "someone-else", "ledger.1"),
		} {
			ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: []byte(`{"account":1,"amount":1000}`), Header: nats.Header{jetstream.MsgIDHeader: {id}}})
			if err != nil {
				t.Fatalf("publish %s on %s: %v", id, subj, err)
			}
			if ack.Stream != e.m.Stream {
				t.Fatalf("%s stored in %s", id, ack.Stream)
			}
			spoofed = append(spoofed, id)
		}
		producer.expectNoAsyncError(t)
		// Nothing that reaches a stream otherwise: dead letters, the
		// partitions' advisories, a subject without key and kind.
		for _, subj := range []string{
			"dlq." + e.m.Subject + ".3." + shard.Key("x") + ".ledger.1",
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + e.m.Stream + "." + e.m.Durable(3),
			e.m.Subject + "." + shard.Key("x"),
			"$JS.API.CONSUMER.CREATE." + e.m.Stream + ".mine",
		} {
			producer.expectPublishDenied(t, subj)
		}
		producer.nc.Close()
		rec.check(t, "producer", producerShardPublish)
	})
	if t.Failed() {
		return
	}

	// Every published ID once, the spoofs, the given-up intent.
	total := generated + 1 + len(spoofed) + 1
	t.Run("consumers", func(t *testing.T) {
		// The dead letters as they are published (a subscription publishes
		// nothing, so the recording does not see it).
		dead, err := admin.nc.SubscribeSync("dlq." + e.m.Subject + ".>")
		if err != nil {
			t.Fatal(err)
		}
		defer dead.Unsubscribe()
		rec := startRecording(t, admin.nc)
		ps := e.startShards(t)
		// A rejected binding writes no inbox row: the spoofs are in the
		// dead letters alone.
		e.settled(t, pools, total-len(spoofed), spoofed)
		for range spoofed {
			if _, err := dead.NextMsg(30 * time.Second); err != nil {
				t.Fatalf("dead letters of the spoofs: %v", err)
			}
		}
		e.stopShards(t, ps)
		rec.check(t, "consumer", consumerShardPublish)
		// The given-up intent was rescued once, in the shard owning its
		// partition; the spoofs were rejected, each in its stored
		// partition's shard, and applied nowhere.
		owner := e.m.Owner(gp)
		var status string
		if err := pools[owner].QueryRow(ctx, `SELECT status FROM inbox WHERE scope = $1 AND message_id = $2`, e.m.Scope, givenUp).Scan(&status); err != nil || status != "applied" {
			t.Errorf("%s in shard %s: %q, %v; want applied", givenUp, owner, status, err)
		}
		for name, p := range pools {
			var n int
			if err := p.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE message_id = ANY($1)`, spoofed).Scan(&n); err != nil || n != 0 {
				t.Errorf("shard %s holds %d ledger entries of the spoofed IDs (%v)", name, n, err)
			}
		}
	})
	if t.Failed() {
		return
	}

	// A move while the shards run: partition 7 from its owner to another
	// shard; what is published on it afterwards is applied there.
	const moved = 7
	from := e.m.Owner(moved)
	to := e.m.Shards[len(e.m.Shards)-1].Name
	if to == from {
		to = e.m.Shards[0].Name
	}
	ps := e.startShards(t)
	e.run(t, "", "jetinbox_migrator", "jetinbox", "partitions", "move", fmt.Sprint(moved), "--to", to, "-shards", e.mapFile)
	out := e.run(t, "", "jetinbox_migrator", "jetinbox", "partitions", "list", "-shards", e.mapFile)
	t.Logf("after the move:\n%s", out)
	e.run(t, "producer", "", "producer", "-shards", e.mapFile, "-count", "100", "-accounts", "16", "-prefix", "after-move")
	total += 100
	e.settled(t, pools, total-len(spoofed), spoofed)
	var inMoved, newOwner int
	for i := range 100 {
		if shard.PartitionOf(fmt.Sprintf("after-move-%d", i), e.m.Partitions) == moved {
			inMoved++
		}
	}
	if err := pools[to].QueryRow(ctx, `SELECT count(*) FROM inbox WHERE scope = $1 AND message_id LIKE 'after-move-%' AND subject LIKE $2`,
		e.m.Scope, fmt.Sprintf("%s.%d.%%", e.m.Subject, moved)).Scan(&newOwner); err != nil {
		t.Fatal(err)
	}
	if inMoved == 0 || newOwner != inMoved {
		t.Errorf("partition %d moved to %s: %d of its %d new intents applied there", moved, to, newOwner, inMoved)
	}
	e.stopShards(t, ps)

	t.Run("verify", func(t *testing.T) {
		// A give-up whose rescue is pending (an advisory as the server
		// publishes it, for the given-up intent, applied already; no shard
		// runs to settle it): verify -shards looks up every partition's
		// rescue durable and reads the advisories above its ack floor.
		durable := e.m.Durable(gp)
		planted := fmt.Sprintf(`{"type":"io.nats.jetstream.advisory.v1.max_deliver","id":"pending","timestamp":%q,"stream":%q,"consumer":%q,"stream_seq":%d,"deliveries":5}`,
			time.Now().UTC().Format(time.RFC3339Nano), e.m.Stream, durable, givenUpAck.Sequence)
		if err := admin.nc.Publish(maxDeliveriesSubject(e.m.Stream, durable), []byte(planted)); err != nil {
			t.Fatal(err)
		}
		eventually(t, ctx, func() error {
			rc, err := adminJS.Consumer(ctx, d.advisories.Name, durable)
			if err != nil {
				return err
			}
			// Pending, or delivered and not acked (a shard's last pull
			// request may have taken it as the shard stopped): either way
			// not settled, above the durable's ack floor, which is what
			// verify reads.
			if info, err := rc.Info(ctx); err != nil || info.NumPending+uint64(info.NumAckPending) == 0 {
				return fmt.Errorf("rescue durable %+v (%v): the advisory is neither pending nor waiting for its ack", info, err)
			}
			return nil
		})
		rec := startRecording(t, admin.nc)
		out := e.run(t, "verify", "jetinbox_verifier", "jetinbox", "verify", "-shards", e.mapFile, "-json")
		rec.check(t, "verify", verifyShardPublish)
		// verify exits 1 on a violation; the counts must be these too.
		var r struct {
			DistinctIDs  int `json:"distinct_ids"`
			AppliedOnce  int `json:"applied_once"`
			DeadLettered int `json:"dead_lettered"`
			Lost         int `json:"lost"`
			Duplicated   int `json:"duplicated"`
			Unexpected   int `json:"unexpected"`
			Awaiting     int `json:"awaiting_rescue"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("verify -json: %v\n%s", err, out)
		}
		if r.DistinctIDs != total || r.AppliedOnce != total-len(spoofed) || r.DeadLettered != len(spoofed) || r.Lost+r.Duplicated+r.Unexpected+r.Awaiting != 0 {
			t.Errorf("verify -shards: %+v; want %d IDs, %d applied once, the %d spoofs dead-lettered", r, total, total-len(spoofed), len(spoofed))
		}
		t.Logf("verify -shards: %s", out)
	})
	t.Logf("done in %v", time.Since(started).Round(time.Millisecond))
}
