// Package readme runs the README's operator path as written: the commands
// of "Running the pieces", one by one, against a real nats-server and a
// real PostgreSQL the test starts. When the README changes, this test runs
// the new commands.
package readme

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// elsewhere are the README commands this test does not run, and the tests
// that do: long runs with servers of their own.
var elsewhere = map[string]string{
	"chaos":  "internal/chaos TestChaosSmoke",
	"bench":  "make bench-smoke and internal/bench",
	"jitter": "internal/jittersim tests",
}

// codeBlock returns the lines of the first fenced block after heading.
func codeBlock(t *testing.T, readme, heading, fence string) []string {
	t.Helper()
	i := strings.Index(readme, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q", heading)
	}
	rest := readme[i:]
	j := strings.Index(rest, "```"+fence+"\n")
	if j < 0 {
		t.Fatalf("no ```%s block after %q", fence, heading)
	}
	rest = rest[j+len("```"+fence+"\n"):]
	return strings.Split(rest[:strings.Index(rest, "```")], "\n")
}

// TestRunningThePieces builds the binaries and runs every command of the
// README's "Running the pieces" block literally, with the export line
// pointed at the test's servers: migrate, accounts, the producer (the
// generated load and the README's JSONL example), the consumer until
// SIGTERM, verify, dlq, replay and prune. It ends with every intent applied
// once, verify clean, and a drained consumer.
func TestRunningThePieces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	lines := codeBlock(t, readme, "## Running the pieces", "sh")
	jsonl := codeBlock(t, readme, "## Running the pieces", "json")

	srv := testenv.NewNATS(t, testenv.NATSOptions{})
	dbURL := testenv.NewDatabase(t)
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "intents.jsonl"), []byte(strings.Join(jsonl, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr := freeAddr(t)
	env := append(os.Environ(), "JETINBOX_HTTP_ADDR="+httpAddr, "JETINBOX_LOG_FORMAT=text")

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)

	var consumer *exec.Cmd
	var consumerOut bytes.Buffer
	t.Cleanup(func() {
		if consumer != nil && consumer.ProcessState == nil {
			_ = consumer.Process.Kill()
			_ = consumer.Wait()
		}
	})
	run := func(line string) string {
		t.Helper()
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir, cmd.Env = work, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		return string(out)
	}
	var produced int
	ran := map[string]bool{}
	for _, raw := range lines {
		line, _, _ := strings.Cut(raw, " #")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "go build -o bin/ "):
			// Built from the repository into the test's own bin/.
			cmd := exec.Command("go", "build", "-o", filepath.Join(work, "bin")+"/", fields[len(fields)-1])
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
			ran["build"] = true
			continue
		case strings.HasPrefix(line, "export "):
			// The README's placeholders name its hosts; the test's servers
			// stand in for them.
			if !strings.Contains(line, "DATABASE_URL=") || !strings.Contains(line, "NATS_URL=") {
				t.Fatalf("the export line no longer sets DATABASE_URL and NATS_URL: %s", line)
			}
			env = append(env, "DATABASE_URL="+dbURL, "NATS_URL="+srv.URL())
			ran["export"] = true
			continue
		}
		name := filepath.Base(fields[0])
		if name == "jetinbox" && len(fields) > 1 {
			name = fields[1]
		}
		if why, ok := elsewhere[name]; ok {
			t.Logf("not run here (%s runs it): %s", why, line)
			continue
		}
		ran[name] = true
		switch name {
		case "producer":
			out := run(line)
			n := regexp.MustCompile(`-count (\d+)`).FindStringSubmatch(line)
			if n == nil {
				t.Fatalf("the producer line has no -count: %s", line)
			}
			var c int
			fmt.Sscan(n[1], &c)
			produced += c
			t.Logf("%s\n%s", line, lastLines(out, 3))
			// The alternative in the comment: the README's JSONL example.
			if strings.Contains(raw, "-input intents.jsonl") {
				out := run("bin/producer -input intents.jsonl")
				produced += len(nonEmpty(jsonl))
				t.Logf("bin/producer -input intents.jsonl\n%s", lastLines(out, 3))
			}
		case "consumer":
			consumer = exec.Command("sh", "-c", "exec "+line)
			consumer.Dir, consumer.Env = work, env
			consumer.Stdout, consumer.Stderr = &consumerOut, &consumerOut
			if err := consumer.Start(); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			err := pipeline.WaitSettled(wctx, js, jsinbox.DefaultStream, "ledger", nil)
			cancel()
			if err != nil {
				t.Fatalf("%s: %v\n%s", line, err, lastLines(consumerOut.String(), 20))
			}
			for _, path := range []string{"/readyz", "/metrics"} {
				if err := get("http://" + httpAddr + path); err != nil {
					t.Errorf("consumer %s: %v", path, err)
				}
			}
		default:
			out := run(line)
			t.Logf("%s\n%s", line, lastLines(out, 12))
			if name == "verify" && !regexp.MustCompile(fmt.Sprintf(`applied once +%d\b`, produced)).MatchString(out) {
				t.Errorf("verify does not report all %d intents applied once:\n%s", produced, out)
			}
		}
	}
	for _, want := range []string{"build", "export", "migrate", "accounts", "producer", "consumer", "verify", "dlq", "replay", "prune"} {
		if !ran[want] {
			t.Errorf("the README's path no longer runs %s", want)
		}
	}
	if consumer == nil {
		return
	}
	// SIGTERM: the consumer drains and exits 0.
	if err := consumer.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- consumer.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(consumerOut.String(), "draining") {
			t.Fatalf("consumer after SIGTERM: %v\n%s", err, lastLines(consumerOut.String(), 20))
		}
	case <-time.After(time.Minute):
		t.Fatal("consumer did not drain within a minute of SIGTERM")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func get(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

func nonEmpty(lines []string) []string {
	var out []string
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
