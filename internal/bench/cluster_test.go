package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/internal/cli"
)

// TestClusterBenchSmoke runs jetinbox bench -cluster at a tiny size, so
// that it keeps running: every producer row, raw and jetinbox with two
// consumer counts (the ledger is checked after each), and the latency
// phase.
func TestClusterBenchSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five clusters")
	}
	var progress bytes.Buffer
	o := ClusterOptions{N: 500, ProducerN: 200, ProducerBatch: 50, Consumers: []int{1, 2}, Batch: 100, InFlight: 2, Accounts: 16, Latency: time.Second, Rate: 200}
	res, err := RunCluster(context.Background(), o, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var out bytes.Buffer
	res.Write(&out, o)
	t.Logf("\n%s", out.String())
	if len(res.Producer) != 8 || len(res.Consumer) != 3 || len(res.Latency) != 200 {
		t.Errorf("%d producer rows, %d consumer rows, %d latencies", len(res.Producer), len(res.Consumer), len(res.Latency))
	}
	for _, p := range res.Producer {
		if p.Rate <= 0 {
			t.Errorf("producer row %+v", p)
		}
	}
}

func TestClusterBenchFlags(t *testing.T) {
	for _, args := range [][]string{{"-consumers", "1,x"}, {"-consumers", "0"}, {"-n", "0"}, {"-publish-batch", "5000"}, {"extra"}} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), append([]string{"-cluster"}, args...), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), "bench -cluster") || cli.ExitCode(err) != 2 {
			t.Errorf("%q: %v (exit %d, want 2)", args, err, cli.ExitCode(err))
		}
	}
}
