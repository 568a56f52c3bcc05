package chaos

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/internal/cli"
)

// smokePowerRows are the rows CI runs: every row but the R3 ones added
// for the partition during a power cut, the damaged store file and the
// unsafe sync interval on three nodes, and PostgreSQL's
// synchronous_commit=off, which only the command runs (the cluster phase
// of the tests has no time left for them; the unsafe NATS and SQLite rows
// show that the harness sees loss); of the damaged file, CI runs the R1
// row, whose loss verify must report.
var smokePowerRows = []string{"shipped-pg", "shipped-sqlite", "shipped-r3", "shipped-r3-one",
	"unsafe-nats-sync", "unsafe-sqlite-normal", "unsafe-r1-damaged-blk"}

// TestPowerLossSmoke is the CI-sized power-loss run: the smoke rows, one
// cut each, right after a burst of acknowledged publishes. The shipped
// rows must lose, duplicate and invent nothing and verify must agree; an
// unsafe row must show loss, or the harness could not see any; and the
// R1 stream whose store file was truncated must apply nothing twice while
// verify reports what the stream lost.
func TestPowerLossSmoke(t *testing.T) {
	var progress bytes.Buffer
	start := time.Now()
	rows, err := RunPowerLoss(context.Background(), PowerOptions{Rows: smokePowerRows, Cuts: 1, Intents: 600, Rate: 400, Burst: 150, Seed: 1,
		Settle: 90 * time.Second, Progress: &progress})
	t.Logf("\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	WritePowerTable(&b, rows)
	t.Logf("%.0fs\n%s", time.Since(start).Seconds(), b.String())
	if len(rows) != len(smokePowerRows) {
		t.Fatalf("%d rows, want %d", len(rows), len(smokePowerRows))
	}
	lost := map[string]int{}
	for _, r := range rows {
		if r.Err != nil {
			t.Errorf("%s: %v", r.Spec.Name, r.Err)
			continue
		}
		if r.Cuts != 1 {
			t.Errorf("%s: %d cuts, want 1", r.Spec.Name, r.Cuts)
		}
		lost[r.Spec.Name] = r.Lost
		if r.Spec.Damage && !r.Spec.Shipped {
			// What the damage took: the inbox applies nothing twice, and
			// verify must say the stream lost messages (effects whose
			// message is gone, or messages never applied) however the
			// consumers fared.
			if r.Duplicated != 0 || r.Verify == nil || r.Verify.Duplicated != 0 {
				t.Errorf("%s: duplicated %d (verify %v): a damaged stream must never make an effect apply twice", r.Spec.Name, r.Duplicated, r.Verify)
			}
			if r.Verify == nil || r.Verify.Clean() || r.Verify.Unexpected+r.Verify.Lost == 0 {
				t.Errorf("%s: verify does not report what the truncated store file lost (report %+v; the producer counts %d lost)", r.Spec.Name, r.Verify, r.Lost)
			}
		}
		if r.Spec.Shipped && (!r.Clean() || r.AppliedOnce+r.DeadLettered != r.Acked()) {
			t.Errorf("%s: lost %d, duplicated %d, unexpected %d, applied %d + dead-lettered %d of %d acked, verify clean %v",
				r.Spec.Name, r.Lost, r.Duplicated, r.Unexpected, r.AppliedOnce, r.DeadLettered, r.Acked(), r.Verify != nil && r.Verify.Clean())
		}
	}
	if lost["unsafe-nats-sync"] == 0 && lost["unsafe-sqlite-normal"] == 0 {
		t.Error("neither nats-server's default sync interval nor SQLite's synchronous=NORMAL lost anything: the harness cannot be shown to see loss")
	}
}

// TestPowerLossFlags: bad flags are usage errors (exit 2).
func TestPowerLossFlags(t *testing.T) {
	for _, args := range [][]string{{"-rows", "shipped-pg,meteor"}, {"-cuts", "0"}, {"-intents", "0"}, {"-rate", "0"}, {"-burst", "-1"},
		{"-settle", "0s"}, {"extra"}, {"-cuts", "x"}} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), append([]string{"-power-loss"}, args...), &out, &errOut)
		if cli.ExitCode(err) != 2 {
			t.Errorf("%q: %v (exit %d, want 2)", args, err, cli.ExitCode(err))
		}
	}
}
