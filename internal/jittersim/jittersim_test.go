package jittersim_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/internal/jittersim"
	"github.com/jetinbox/jetinbox/jitter"
)

// TestMulberry32 pins the generator against the first outputs of mulberry32 seeded with 42, as
// its JavaScript form (quoted on Mulberry32.Float64) computes them, times 2³².
func TestMulberry32(t *testing.T) {
	t.Parallel()
	m := jittersim.NewMulberry32(42)
	for i, want := range []uint32{2581720956, 1925393290, 3661312704, 2876485805, 750819978} {
		if got := uint32(m.Float64() * (1 << 32)); got != want {
			t.Errorf("output %d = %d; want %d", i, got, want)
		}
	}
}

// TestStormTable pins the retry storm's table at the defaults, the one docs/operations.md quotes: peak
// retries in one 10 ms bucket of 5000 = 1000 / 157 / 214 / 73.
func TestStormTable(t *testing.T) {
	t.Parallel()
	rows := jittersim.Storm(jittersim.DefaultConfig())
	want := []struct {
		name string
		peak int
	}{{"no jitter", 1000}, {"full jitter", 157}, {"equal jitter", 214}, {"decorrelated", 73}}
	if len(rows) != len(want)+1 {
		t.Fatalf("%d rows; want %d", len(rows), len(want)+1)
	}
	for i, w := range want {
		r := rows[i]
		if r.Name != w.name || r.Peak != w.peak || r.Total != 5000 || r.Varies {
			t.Errorf("row %d = %s peak %d total %d varies %v; want %s peak %d total 5000",
				i, r.Name, r.Peak, r.Total, r.Varies, w.name, w.peak)
		}
	}
	last := rows[len(rows)-1]
	if last.Name != "backoff/v4" || !last.Varies || last.Total != 5000 || last.Peak <= 0 || last.Peak >= 1000 {
		t.Errorf("backoff/v4 row = %+v", last)
	}
}

func TestSameSeedSameNumbers(t *testing.T) {
	t.Parallel()
	c := jittersim.DefaultConfig()
	c.Seed = 7
	a, b := jittersim.Storm(c), jittersim.Storm(c)
	for i := range a {
		if a[i].Varies {
			continue
		}
		if a[i].Peak != b[i].Peak || !slices.Equal(a[i].Buckets, b[i].Buckets) {
			t.Errorf("storm %s differs between runs with seed 7", a[i].Name)
		}
	}
	x, y := jittersim.Overload(c), jittersim.Overload(c)
	for i := range x {
		if x[i].Varies {
			continue
		}
		if x[i].Done != y[i].Done || x[i].Requests != y[i].Requests || !slices.Equal(x[i].Buckets, y[i].Buckets) {
			t.Errorf("overloaded %s differs between runs with seed 7", x[i].Name)
		}
	}
	c.Seed = 8
	if z := jittersim.Overload(c); z[1].Requests == x[1].Requests && slices.Equal(z[1].Buckets, x[1].Buckets) {
		t.Errorf("seeds 7 and 8 gave the same overloaded run for %s", z[1].Name)
	}
}

// TestOverloadRanking checks that every policy serves every client and that the ranking
// that chose jitter.Default holds across seeds and server capacities.
func TestOverloadRanking(t *testing.T) {
	t.Parallel()
	want := []string{"decorrelated", "full", "equal", "none"}
	if jitter.Default().Kind.String() != want[0] {
		t.Errorf("jitter.Default().Kind = %v; the simulation ranks %s first", jitter.Default().Kind, want[0])
	}
	for _, capacity := range []int{50, 10} {
		for _, seed := range []uint32{1, 2, 3, 42, 1234, 99999} {
			c := jittersim.DefaultConfig()
			c.Seed, c.Capacity = seed, capacity
			results := jittersim.Overload(c)
			if got := jittersim.Rank(results); !slices.Equal(got, want) {
				t.Errorf("capacity %d, seed %d: ranking %v; want %v", capacity, seed, got, want)
			}
			for _, r := range results {
				if r.Kind == jitter.None {
					continue // with capacity 10, 1000 clients need 100 retries in lockstep: half give up
				}
				if r.Failed != 0 || r.Done <= 0 || r.Requests < c.Clients {
					t.Errorf("capacity %d, seed %d: %s: %d gave up, done %v, %d requests",
						capacity, seed, r.Name, r.Failed, r.Done, r.Requests)
				}
			}
		}
	}
}

func TestOverloadGiveUp(t *testing.T) {
	t.Parallel()
	c := jittersim.DefaultConfig()
	c.Capacity, c.OverloadAttempts = 10, 50
	r := jittersim.Overload(c)[0] // none: 10 succeed per retry, all together
	if r.Kind != jitter.None || r.Failed != 500 || r.Requests != 50*1000-10*(49*50/2) {
		t.Errorf("none with capacity 10: %d gave up, %d requests; want 500 and %d", r.Failed, r.Requests, 50*1000-10*(49*50/2))
	}
}

func TestChart(t *testing.T) {
	t.Parallel()
	small := jittersim.DefaultConfig()
	small.Clients, small.Attempts = 20, 2 // PNG rasterizing is slow under -race; the format is what counts
	for _, tt := range []struct {
		name string
		c    jittersim.Config
	}{{"jitter.svg", jittersim.DefaultConfig()}, {"jitter.png", small}} {
		path := filepath.Join(t.TempDir(), tt.name)
		if err := jittersim.WriteChart(path, tt.c, jittersim.Storm(tt.c), jittersim.Overload(tt.c)); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || len(b) == 0 {
			t.Fatalf("%s: %d bytes, %v", tt.name, len(b), err)
		}
		if magic := map[string]string{".svg": "<?xml", ".png": "\x89PNG"}[filepath.Ext(path)]; !bytes.HasPrefix(b, []byte(magic)) {
			t.Errorf("%s starts with %q; want %q", tt.name, b[:min(len(b), 8)], magic)
		}
	}
	if err := jittersim.WriteChart(filepath.Join(t.TempDir(), "missing", "x.svg"), small,
		jittersim.Storm(small), jittersim.Overload(small)); err == nil {
		t.Error("WriteChart into a missing directory: no error")
	}
}

func TestMainOutput(t *testing.T) {
	t.Parallel()
	chart := filepath.Join(t.TempDir(), "out.svg")
	var stdout, stderr bytes.Buffer
	if err := jittersim.Main(context.Background(), []string{"-chart", chart}, &stdout, &stderr); err != nil {
		t.Fatalf("Main: %v\n%s", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"no jitter     peak retries in one 10 ms bucket: 1000   (total 5000)\n",
		"full jitter   peak retries in one 10 ms bucket:  157   (total 5000)\n",
		"equal jitter  peak retries in one 10 ms bucket:  214   (total 5000)\n",
		"decorrelated  peak retries in one 10 ms bucket:   73   (total 5000)\n",
		"backoff/v4    peak retries in one 10 ms bucket:",
		"varies per run",
		"overloaded server",
		"ranking (fewest requests sent, then lowest peak): decorrelated < full < equal < none",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasPrefix(out, "no jitter ") {
		t.Errorf("output does not start with the storm table:\n%s", out)
	}
	if fi, err := os.Stat(chart); err != nil || fi.Size() == 0 {
		t.Errorf("chart: %v, %v", fi, err)
	}
}

func TestMainFlags(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	err := jittersim.Main(context.Background(), []string{"-h"}, &stdout, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Errorf("Main -h = %v; want flag.ErrHelp", err)
	}
	for _, f := range []string{"-clients", "-base", "-cap", "-attempts", "-bucket", "-seed", "-capacity", "-chart"} {
		if !strings.Contains(stderr.String(), f) {
			t.Errorf("usage lacks %s:\n%s", f, stderr.String())
		}
	}

	// Other parameters, no chart.
	stdout.Reset()
	if err := jittersim.Main(context.Background(), []string{"-clients", "10", "-attempts", "2", "-chart", ""}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "(total 20)") || strings.Contains(stdout.String(), "chart:") {
		t.Errorf("output:\n%s", stdout.String())
	}

	for _, args := range [][]string{{"-clients", "0"}, {"-cap", "1ms"}, {"-bucket", "0s"}, {"-capacity", "-1"}, {"extra"}} {
		if err := jittersim.Main(context.Background(), append(args, "-chart", ""), &stdout, &stderr); err == nil {
			t.Errorf("Main %v: no error", args)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := jittersim.Main(ctx, []string{"-chart", ""}, &stdout, &stderr); !errors.Is(err, context.Canceled) {
		t.Errorf("Main with a canceled context = %v", err)
	}
}

// TestMainWritesNoChartUnasked: without -chart, Main writes no file, in the
// working directory or anywhere else.
func TestMainWritesNoChartUnasked(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	var stdout, stderr bytes.Buffer
	if err := jittersim.Main(context.Background(), []string{"-clients", "10", "-attempts", "2"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stdout.String(), "chart:") {
		t.Errorf("output names a chart:\n%s", stdout.String())
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		t.Errorf("working directory after jitter without -chart: %v, %v", ents, err)
	}
}
