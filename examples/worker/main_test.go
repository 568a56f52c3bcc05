package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// readme:begin
// placeOrder publishes an intent whose ID is fixed when the order is made, so
// a retry of it, however late, is dropped and never ships twice. Publish
// waits for the stream's PubAck (PublishAsync does not).
func placeOrder(ctx context.Context, pub *jsinbox.Publisher, order, city string) error {
	body, _ := json.Marshal(map[string]string{"order": order, "city": city})
	_, err := pub.Publish(ctx, inbox.Intent{ID: "ship-" + order, Subject: "intents.shipping", Payload: body})
	return err
}

// readme:end

// TestReadme: the README's first Go block is main.go, whole, and the
// others are, in order, the readme:begin … readme:end regions of this file.
func TestReadme(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	prog, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("main_test.go")
	if err != nil {
		t.Fatal(err)
	}
	shown := fencedBlocks(string(readme), "```go")
	want := append([]string{strings.Trim(string(prog), "\n")}, markedRegions(t, string(self))...)
	if len(shown) != len(want) {
		t.Errorf("the README has %d Go blocks, want %d: examples/worker/main.go and each region of main_test.go", len(shown), len(want))
	}
	for i := range min(len(shown), len(want)) {
		if shown[i] != want[i] {
			t.Errorf("the README's Go block %d differs; make it\n%s", i+1, want[i])
		}
	}
	if !strings.Contains(string(readme), "go get github.com/jetinbox/jetinbox") {
		t.Error("the README has no go get line")
	}
}

// servers starts a nats-server (sync_interval: always) and a database with
// the inbox schema, as a deploy step leaves them.
func servers(t *testing.T) (natsURL, dbURL string, js jetstream.JetStream, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	dbURL = testenv.NewDatabase(t)
	pool, err = pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pginbox.New(pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return srv.URL(), dbURL, js, pool
}

// placeOrders publishes the README's orders (one twice, one with no city)
// once the worker has made the stream, and waits until the two shipments
// and the one dead letter are there.
func placeOrders(t *testing.T, js jetstream.JetStream, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		if _, err := js.Stream(ctx, jsinbox.DeadLetterStream(jsinbox.DefaultStream)); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the worker made no stream")
		}
		time.Sleep(20 * time.Millisecond)
	}
	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, o := range [][2]string{{"o-1", "Lisbon"}, {"o-2", "Oslo"}, {"o-1", "Lisbon"}, {"o-3", ""}} {
		if err := placeOrder(ctx, pub, o[0], o[1]); err != nil {
			t.Fatal(err)
		}
	}
	dlq, err := js.Stream(ctx, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	for {
		var shipped int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&shipped)
		info, err := dlq.Info(ctx)
		if err == nil && shipped == 2 && info.State.Msgs == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("shipped %d, dead-letter info %v, %v", shipped, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var got []string
	rows, err := pool.Query(ctx, `SELECT order_id || ' to ' || city FROM shipments ORDER BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if strings.Join(got, ", ") != "o-1 to Lisbon, o-2 to Oslo" {
		t.Errorf("shipped %q", got)
	}
	dl, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if id, reason := dl.Header.Get(jsinbox.HeaderMessageID), dl.Header.Get(jsinbox.HeaderReason); id != "ship-o-3" || reason != "no city to ship to" {
		t.Errorf("dead letter %s: %s", id, reason)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestWorker runs the README's program against a real nats-server and
// PostgreSQL: it makes the stream, logs its start at Info, ships each order
// once, dead-letters the one with no city, and returns nil on cancel.
func TestWorker(t *testing.T) {
	natsURL, dbURL, js, pool := servers(t)
	var logs syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, natsURL, dbURL) }()
	placeOrders(t, js, pool)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	start := `msg="jsinbox: consuming" stream=INTENTS durable=shipping scope=shipping store=pginbox.Store`
	if !strings.Contains(logs.String(), start) {
		t.Errorf("no start-up line %s in\n%s", start, logs.String())
	}
}

// TestScratchEmbedder builds main.go as the main package of a module of its
// own that requires this one (replaced by this checkout), runs it against
// real servers, stops it with SIGTERM, and checks its go.sum: no
// nats-server, which only this module's tests use (those that need one
// live under internal/servertest, where no embedder's go mod tidy looks).
func TestScratchEmbedder(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module of its own")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prog, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	gomod := fmt.Sprintf("module example.com/worker\n\ngo 1.26.0\n\nrequire github.com/jetinbox/jetinbox v0.0.0\n\nreplace github.com/jetinbox/jetinbox => %s\n", root)
	// This checkout's go.sum holds the checksum of every module the
	// scratch module can need; tidy keeps the lines it uses, so nothing
	// is looked up in the checksum database (which may not be reachable).
	rootSum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{"main.go": prog, "go.mod": []byte(gomod), "go.sum": rootSum} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gocmd := func(args ...string) {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// Modules come from the module cache this checkout was built
		// from, or the module proxy for one only the module graph names;
		// their checksums from the seeded go.sum.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	gocmd("mod", "tidy")
	gocmd("build", "-o", "worker", ".")
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(string(sum), "\n")
	mods := exec.Command("go", "list", "-m", "all")
	mods.Dir = dir
	mods.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	out, err := mods.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -m all: %v\n%s", err, stderr)
	}
	t.Logf("scratch embedder: %d go.sum lines, %d modules", lines, strings.Count(string(out), "\n"))
	if strings.Contains(string(sum), "nats-io/nats-server") {
		t.Errorf("the embedder's go.sum has nats-server: a test of a package it imports needs one; move that test under internal/servertest")
	}
	for _, other := range []string{"go.uber.org/goleak", "prometheus/client_golang"} {
		if strings.Contains(string(sum), other) {
			t.Logf("the embedder's go.sum has %s (from the tests of the packages it imports)", other)
		}
	}

	natsURL, dbURL, js, pool := servers(t)
	var logs syncBuffer
	w := exec.Command(filepath.Join(dir, "worker"))
	w.Env = append(os.Environ(), "NATS_URL="+natsURL, "DATABASE_URL="+dbURL)
	w.Stdout, w.Stderr = &logs, &logs
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	placeOrders(t, js, pool)
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Fatalf("worker: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "jsinbox: consuming") {
		t.Errorf("no start-up line in\n%s", logs.String())
	}
}

// fencedBlocks returns the bodies of the blocks of doc that open with the
// line fence, without surrounding blank lines.
func fencedBlocks(doc, fence string) []string {
	var blocks []string
	var cur []string
	in := false
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case !in && strings.TrimSpace(line) == fence:
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			blocks = append(blocks, strings.Trim(strings.Join(cur, "\n"), "\n"))
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

// markedRegions returns the code between each "// readme:begin" line and
// the next "// readme:end" line of src, without surrounding blank lines.
func markedRegions(t *testing.T, src string) []string {
	t.Helper()
	var regions []string
	var cur []string
	in := false
	for i, line := range strings.Split(src, "\n") {
		switch strings.TrimSpace(line) {
		case "// readme:begin":
			if in {
				t.Fatalf("main_test.go:%d: readme:begin inside a region", i+1)
			}
			in, cur = true, nil
		case "// readme:end":
			if !in {
				t.Fatalf("main_test.go:%d: readme:end outside a region", i+1)
			}
			in = false
			regions = append(regions, strings.Trim(strings.Join(cur, "\n"), "\n"))
		default:
			if in {
				cur = append(cur, line)
			}
		}
	}
	if in {
		t.Fatal("main_test.go: a readme:begin region does not end")
	}
	return regions
}
