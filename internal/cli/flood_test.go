package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// childConsumerEnv, when set, makes the test binary run the consumer
// command with the JSON array of arguments it holds, in a process of its
// own, until SIGTERM: its memory is then its own to measure.
const childConsumerEnv = "JETINBOX_TEST_CHILD_CONSUMER"

// childHeapFile, when set for a child consumer, is where it writes the
// largest live heap (bytes the garbage collector found reachable, sampled
// every few milliseconds) it had, when it exits.
const childHeapFile = "JETINBOX_TEST_CHILD_HEAP_FILE"

func runChildConsumer() int {
	var args []string
	if err := json.Unmarshal([]byte(os.Getenv(childConsumerEnv)), &args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	sampled := make(chan uint64, 1)
	sampling, stopSampling := context.WithCancel(context.Background())
	go func() {
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		var peak uint64
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(s)
			if s[0].Value.Kind() == metrics.KindUint64 {
				peak = max(peak, s[0].Value.Uint64())
			}
			select {
			case <-sampling.Done():
				sampled <- peak
				return
			case <-tick.C:
			}
		}
	}()
	err := Consumer(ctx, args, os.Getenv, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	stopSampling()
	if f := os.Getenv(childHeapFile); f != "" {
		if werr := os.WriteFile(f, []byte(strconv.FormatUint(<-sampled, 10)), 0o600); werr != nil {
			fmt.Fprintln(os.Stderr, werr)
		}
	}
	return ExitCode(err)
}

// peakRSS reads a process's peak resident set size (VmHWM) in bytes.
func peakRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// TestConsumerMemoryBoundedUnderFlood floods the intents stream with
// messages of the largest size it accepts, half of them valid ledger
// intents padded to the ledger's 4 KiB limit, half too big for the ledger,
// and runs the consumer command in a process of its own with its default
// batch (6,000 × 2 in flight) and -max-bytes 8MiB: its peak RSS stays
// far below what the flood would take if the consumer buffered by message
// count alone (12,000 × 8 KiB in the pull buffer, as many again in
// batches), and every message is applied or dead-lettered.
func TestConsumerMemoryBoundedUnderFlood(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc to measure the consumer's memory")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := pipelinetest.New(t, jsinbox.StreamConfig{}, 16)
	info, err := e.JS.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	maxSize := int(info.CachedInfo().Config.MaxMsgSize)
	if maxSize != jsinbox.DefaultMaxMsgSize {
		t.Fatalf("stream max_msg_size %d, want the default %d", maxSize, jsinbox.DefaultMaxMsgSize)
	}

	const n = 16000
	intent := []byte(`{"account":1,"amount":1}`)
	valid := append(intent, []byte(strings.Repeat(" ", effects.MaxIntentSize-len(intent)))...)
	began := time.Now()
	for i := range n {
		id := fmt.Sprintf("flood-%06d", i)
		m := &nats.Msg{Subject: "intents.flood", Header: nats.Header{jetstream.MsgIDHeader: {id}}}
		if i%2 == 0 {
			m.Data = valid
		} else {
			// Exactly the stream's limit: header, subject and payload.
			hdr := len("NATS/1.0\r\n") + len(jetstream.MsgIDHeader) + 2 + len(id) + 2 + 2
			m.Data = append(append([]byte(nil), intent...), strings.Repeat(" ", maxSize-hdr-len(intent))...)
		}
		if _, err := e.JS.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
		if i%2000 == 1999 {
			select {
			case <-e.JS.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("publishing the flood timed out")
			}
		}
	}
	<-e.JS.PublishAsyncComplete()
	if info, err := e.JS.Stream(ctx, jsinbox.DefaultStream); err != nil || info.CachedInfo().State.Msgs != n {
		t.Fatalf("stream holds %+v (%v), want %d messages", info.CachedInfo().State, err, n)
	}
	t.Logf("published %d messages (%d MiB) in %v", n, n*maxSize>>20, time.Since(began).Round(time.Millisecond))

	args, _ := json.Marshal([]string{"-http", "", "-log-format", "text", "-max-bytes", "8MiB"})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	heapFile := filepath.Join(t.TempDir(), "heap")
	cmd.Env = append(os.Environ(), childConsumerEnv+"="+string(args), childHeapFile+"="+heapFile,
		"NATS_URL="+e.NATS.URL(), "DATABASE_URL="+e.DBURL, "GOMEMLIMIT=64MiB")
	var logs testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	began = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	settled := make(chan error, 1)
	go func() { settled <- pipeline.WaitSettled(ctx, e.JS, jsinbox.DefaultStream, "ledger", nil) }()
	select {
	case err := <-settled:
		if err != nil {
			t.Fatalf("not settled: %v\n%s", err, lastLines(logs.String(), 40))
		}
	case err := <-exited:
		t.Fatalf("the consumer exited: %v\n%s", err, lastLines(logs.String(), 40))
	}
	rss, err := peakRSS(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("settled in %v; the consumer's peak RSS %d MiB", time.Since(began).Round(time.Millisecond), rss>>20)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err != nil {
		t.Fatalf("consumer after SIGTERM: %v\n%s", err, lastLines(logs.String(), 40))
	}
	exited <- nil // for the cleanup
	b, err := os.ReadFile(heapFile)
	if err != nil {
		t.Fatal(err)
	}
	live, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the consumer's largest live heap: %d MiB", live>>20)

	// Without a byte budget the pull buffer alone holds 12,000 × 8 KiB
	// (94 MiB) of this flood, and the batches as much again. The live heap
	// is what the consumer keeps (the race detector, when on, inflates
	// RSS, not this); RSS is checked only without it.
	if limit := int64(48 << 20); live > limit {
		t.Errorf("the consumer's live heap reached %d MiB, want below %d MiB: its buffers are not bounded in bytes", live>>20, limit>>20)
	}
	if limit := int64(110 << 20); !raceEnabled && rss > limit {
		t.Errorf("the consumer's peak RSS is %d MiB, want below %d MiB: its buffers are not bounded in bytes", rss>>20, limit>>20)
	}
	var applied, rejected int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'applied'), count(*) FILTER (WHERE status = 'rejected') FROM inbox`).Scan(&applied, &rejected); err != nil {
		t.Fatal(err)
	}
	dlq, err := e.JS.Stream(ctx, jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	if dl := dlq.CachedInfo().State.Msgs; applied != n/2 || rejected != n/2 || dl != n/2 {
		t.Fatalf("%d applied, %d rejected, %d dead letters; want %d each", applied, rejected, dl, n/2)
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
