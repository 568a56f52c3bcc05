// Memory: the Go heap sampled during the run, this process's peak RSS, and
// the consumer run as a process of its own to show its peak RSS.

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func sampleHeap(peak *atomic.Uint64) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-t.C:
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
			case <-done:
				return
			}
		}
	}()
	return func() { close(done) }
}

func mib(b uint64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// peakRSS is this process's VmHWM.
func peakRSS() string {
	if v := vmHWM(os.Getpid()); v != "" {
		return v
	}
	return "unknown"
}

type childResult struct {
	rate    float64
	peakRSS string
	// earlyRSS is the peak after a quarter of the messages: memory bounded
	// by the configuration stops growing long before the stream ends.
	earlyRSS string
}

// childConsumer runs `jetinbox consumer` (this binary) as a separate process
// on a fresh durable and database, waits until it applied every message, and
// reads its peak RSS (VmHWM) before stopping it.
func childConsumer(ctx context.Context, natsURL string, dbs databases, o Options, want int64) (*childResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	pool, err := dbs.create(ctx, "child", o.Accounts)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	cmd := exec.CommandContext(ctx, exe, "consumer", "-http", "", "-durable", "child", "-batch", strconv.Itoa(o.Batch),
		"-inflight", strconv.Itoa(o.InFlight), "-max-ack-pending", "50000", "-log-format", "json")
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL, "DATABASE_URL="+dbs.url("child"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var rss, early string
	for {
		var n int
		if err := queryRow(ctx, pool, `SELECT count(*) FROM inbox`, &n); err != nil {
			return nil, err
		}
		if v := vmHWM(cmd.Process.Pid); v != "" {
			rss = v
			if early == "" && n >= o.N/4 {
				early = v
			}
		}
		if n >= o.N {
			break
		}
		if time.Since(start) > 10*time.Minute {
			return nil, fmt.Errorf("child consumer: %d of %d after 10 minutes:\n%s", n, o.N, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	el := time.Since(start)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := checkLedger(ctx, pool, o.N, want); err != nil {
		return nil, err
	}
	pool.Close()
	if err := dbs.drop(ctx, "child"); err != nil {
		return nil, err
	}
	return &childResult{rate: float64(o.N) / el.Seconds(), peakRSS: rss, earlyRSS: early}, nil
}

func vmHWM(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.Atoi(f[1])
			return fmt.Sprintf("%d MiB", kb/1024)
		}
	}
	return ""
}
