package console_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/console"
	"github.com/jetinbox/jetinbox/internal/app"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestConsoleSharded: on a sharded pipeline (two shards, set up and run by
// the project's own commands) the partitions page shows each partition's
// owner and durable lag, and an intent's timeline reads its shard's
// inbox.
func TestConsoleSharded(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	urls := map[string]string{}
	m := shard.Map{Partitions: 4}
	for i, name := range []string{"a", "b"} {
		urls[name] = testenv.NewDatabase(t)
		set, _ := shard.ParseSet([]string{"0-1", "2-3"}[i])
		m.Shards = append(m.Shards, shard.Shard{Name: name, DatabaseURLEnv: "SHARD_" + strings.ToUpper(name) + "_URL", Partitions: set})
	}
	m = m.WithDefaults()
	file := filepath.Join(t.TempDir(), "shards.json")
	if err := m.Save(file); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"NATS_URL": srv.URL(), "SHARD_A_URL": urls["a"], "SHARD_B_URL": urls["b"]}
	env := func(k string) string { return vars[k] }
	ctx := context.Background()
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := app.Jetinbox(ctx, args, env, nil, &out, &out)
		return out.String(), err
	}
	mustRun := func(args ...string) {
		t.Helper()
		if out, err := run(args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	mustRun("partitions", "stream", "-shards", file, "-duplicate-window", "1s")
	for _, name := range []string{"a", "b"} {
		mustRun("migrate", "-shards", file, "-shard", name)
		mustRun("accounts", "-open", "1-16", "-database-url", urls[name])
	}
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
	t.Cleanup(func() { stop(); wg.Wait() })
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	for i := range 40 {
		id := fmt.Sprintf("s-%d", i)
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: shard.PublishSubject(m.Subject, id, "ledger.1"), Data: []byte(`{"account":1,"amount":5}`),
			Header: nats.Header{jetstream.MsgIDHeader: {id}}}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); ; {
		out, err := run("verify", "-shards", file)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("verify -shards never clean: %v\n%s", err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	pools := map[string]*pgxpool.Pool{}
	for name, u := range urls {
		p, err := pgxpool.New(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pools[name] = p
	}
	h, err := console.New(console.Config{JS: js, ReadPG: pools["a"], Shards: &m, ShardPools: pools, Stream: m.Stream, Scope: m.Scope})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	get := func(path string) string {
		res, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d\n%s", path, res.StatusCode, b)
		}
		return string(b)
	}
	page := get("/partitions")
	for p := range m.Partitions {
		row := fmt.Sprintf("<td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>0 pending, 0 ack pending</td><td>ok</td>", p, m.Durable(p), m.Owner(p), m.Owner(p))
		if !strings.Contains(page, row) {
			t.Errorf("partitions page lacks %q:\n%s", row, page)
		}
	}
	id := "s-7"
	owner := m.Owner(shard.PartitionOf(id, m.Partitions))
	if page := get("/intent?id=" + id); !strings.Contains(page, "applied once at") || !strings.Contains(page, "table inbox of shard "+owner) {
		t.Errorf("intent %s (shard %s):\n%s", id, owner, page)
	}
	if page := get("/"); !strings.Contains(page, "4 partition durables") {
		t.Errorf("overview of a sharded stream:\n%s", page)
	}
}
