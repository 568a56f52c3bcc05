package chaos

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// nats-server v2.15.2 keeps the staging store of an atomic batch that a
// restart interrupted running after its final shutdown: the stable-id-batch
// rows restart NATS while they publish in atomic batches, and leave one
// file store's goroutines behind (no other row does).
func TestMain(m *testing.M) {
	// The cluster run starts this binary again as nats-servers and as
	// consumer processes.
	subproc.Dispatch(map[string]func([]string) int{
		subproc.RoleNATSServer: subproc.NATSServer,
		subproc.RoleJetinbox:   ConsumerRole,
	})
	testenv.MainNoLeaks(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	)
}

// TestChaosSmoke is the CI-sized chaos run: every producer strategy × every
// consumer strategy under the same faults. Only stable IDs plus the inbox
// may come out clean, and the other rows must show the losses and
// duplicates their strategy invites: the harness can see what it claims to
// check.
func TestChaosSmoke(t *testing.T) {
	t.Parallel()
	const giveUps = 20
	rows, reps, err := Run(context.Background(), Options{
		Intents: 300, Producers: Producers, Consumers: Consumers,
		DropPublish: 0.03, LosePubAck: 0.03, Crash: 0.05, LoseAck: 0.05, Poison: 0.01, GiveUps: giveUps, Restarts: true, Seed: 7,
	})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	WriteTable(&b, rows)
	t.Logf("\n%s", b.String())
	get := func(p, c string) Row {
		for _, r := range rows {
			if r.Producer == p && r.Consumer == c {
				return r
			}
		}
		t.Fatalf("no row %s × %s", p, c)
		return Row{}
	}
	for _, p := range []string{"stable-id", "stable-id-batch"} {
		// 3 of the 300 are poison: dead-lettered, not lost.
		if r := get(p, "jetinbox"); r.Lost != 0 || r.Duplicated != 0 || r.AppliedOnce != 297 || r.DeadLettered != 3 {
			t.Errorf("%s × jetinbox: lost=%d duplicated=%d applied once=%d dead-lettered=%d", p, r.Lost, r.Duplicated, r.AppliedOnce, r.DeadLettered)
		}
	}
	if len(reps) != 2 {
		t.Fatalf("%d verify reports, want one per guaranteed row", len(reps))
	}
	for _, v := range reps {
		if !v.Report.Clean() {
			var b bytes.Buffer
			v.Report.WriteTable(&b)
			t.Errorf("verify after %s × jetinbox:\n%s", v.Producer, b.String())
		}
	}
	// Without a rescue, the messages the server gave up on while nobody
	// listened stay lost.
	if r := get("stable-id", "effect-then-ack"); r.Lost < giveUps {
		t.Errorf("effect-then-ack lost %d, fewer than the %d given up on unheard", r.Lost, giveUps)
	}
	if r := get("stable-id", "effect-then-ack"); r.Duplicated == 0 {
		t.Error("effect-then-ack without an inbox duplicated nothing after a crash between commit and ack")
	}
	if r := get("stable-id", "ack-first"); r.Lost == 0 {
		t.Error("ack-first lost nothing after a crash between ack and effect")
	}
	if r := get("fresh-id", "jetinbox"); r.Duplicated == 0 {
		t.Error("retrying with fresh IDs duplicated nothing despite lost PubAcks")
	}
	if r := get("once", "jetinbox"); r.Lost == 0 {
		t.Error("publishing once lost nothing despite dropped publishes")
	}
}

// TestClusterChaosSmoke is the CI-sized cluster run: every fault phase on
// three nats-server processes with R3 streams (SIGKILL and SIGSTOP of the
// leaders, a consumer process paused past AckWait, a peer replaced during
// a partition, ...), the jetinbox row must lose nothing, duplicate
// nothing, apply nothing unexpected, and verify must pass.
func TestClusterChaosSmoke(t *testing.T) {
	var progress bytes.Buffer
	logs := testenv.NewLogTail(400)
	rows, rep, _, err := RunCluster(context.Background(), ClusterOptions{Intents: 150, Rate: 150, Faults: smokeClusterFaults, SyncAlways: true, Unsafe: true, Progress: &progress,
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnStall: func() { testenv.LogGoroutines(t, "jsinbox") }})
	t.Logf("\n%s", progress.String())
	if err != nil {
		t.Logf("the consumers' last log lines:\n%s", logs)
		t.Fatal(err)
	}
	var b bytes.Buffer
	WriteClusterTable(&b, rows)
	rep.WriteTable(&b)
	t.Logf("\n%s", b.String())
	if len(rows) != 2*len(smokeClusterFaults) {
		t.Fatalf("%d rows, want two per fault (shipped and unsafe)", len(rows))
	}
	// verify counts what reached the stream: every shipped intent, and
	// the twins the stream stored.
	stored, unsafeLost := 0, 0
	for _, r := range rows {
		if r.Unsafe {
			// A twin is published once: never duplicated, and each is
			// counted in exactly one column. Its loss is what the row is
			// for, but no phase is sure to show it in a run this short.
			if r.Duplicated != 0 || r.Unexpected != 0 || r.AppliedOnce+r.Unacknowledged+r.Lost+r.DeadLettered != r.Intents {
				t.Errorf("%s: %+v", r.Fault, r)
			}
			stored += r.AppliedOnce
			unsafeLost += r.Lost
			continue
		}
		if r.Lost != 0 || r.Duplicated != 0 || r.Unexpected != 0 || r.AppliedOnce+r.Unacknowledged != r.Intents || r.Unacknowledged != 0 {
			t.Errorf("%s: %+v", r.Fault, r)
		}
		stored += r.Intents
	}
	t.Logf("unsafe twins lost: %d", unsafeLost)
	if !rep.Clean() || rep.AppliedOnce != stored {
		t.Errorf("verify: clean=%v applied once=%d, want %d", rep.Clean(), rep.AppliedOnce, stored)
	}
}

// smokeClusterFaults are the phases CI runs: the black hole, the one-way
// cut and the server removals run in the command (the cluster phase of
// the tests has no time left for them); natsenv's
// TestNATSProcsClusterBlackHoleRemove covers the black hole and a removal
// on a bare cluster.
var smokeClusterFaults = ClusterFaults[:slices.Index(ClusterFaults, "membership")+1]

func TestClusterChaosFlags(t *testing.T) {
	for _, args := range [][]string{{"-faults", "stream-leader-kill,meteor"}, {"-intents", "0"}, {"-batch", "5000"}, {"-rounds", "0"}, {"-ack-wait", "10ms"}, {"extra"}, {"-intents", "x"}} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), append([]string{"-cluster"}, args...), &out, &errOut)
		if cli.ExitCode(err) != 2 {
			t.Errorf("%q: %v (exit %d, want 2)", args, err, cli.ExitCode(err))
		}
	}
}

// TestPGFailoverSmoke is the CI-sized failover run: publish and consume
// while the primary of a pg_auto_failover formation with a synchronous
// standby is killed behind a stalled standby, then again after the commits
// waiting for the stalled standby were cancelled, and the old primary
// rejoins as secondary each time. Nothing
// acknowledged may be lost, applied twice or applied unasked, and verify
// must agree.
func TestPGFailoverSmoke(t *testing.T) {
	var progress bytes.Buffer
	logs := testenv.NewLogTail(300)
	rows, err := RunPGFailover(context.Background(), PGFailoverOptions{Intents: 300, Rate: 150, Faults: 2, Kinds: []string{"lag-then-kill", "cancel-sync-wait"},
		Modes: []string{ModeSync}, Seed: 3, Progress: &progress,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	t.Logf("\n%s", progress.String())
	if err != nil {
		t.Logf("the consumers' last log lines:\n%s", logs)
		t.Fatal(err)
	}
	var b bytes.Buffer
	WritePGFailoverTable(&b, rows)
	t.Logf("\n%s", b.String())
	if len(rows) != 1 {
		t.Fatalf("%d rows", len(rows))
	}
	r := rows[0]
	if r.Lost != 0 || r.Duplicated != 0 || r.Unexpected != 0 || r.AppliedOnce != r.Intents || !r.Verify.Clean() {
		t.Errorf("synchronous standby through a failover: %+v", r)
		r.Verify.WriteTable(&b)
		t.Log(b.String())
	}
	if !strings.Contains(r.Faults, "promoted") || !strings.Contains(r.Faults, "waiting commits cancelled") {
		t.Errorf("no failover, or no cancelled wait for the standby: %s", r.Faults)
	}
}

// TestPGFailoverFlags: bad flags and a missing pg_auto_failover are usage
// errors (exit 2), the latter naming the Debian packages to install.
func TestPGFailoverFlags(t *testing.T) {
	for _, args := range [][]string{{"-kinds", "kill-primary,meteor"}, {"-modes", "semi"}, {"-intents", "0"}, {"-rate", "0"}, {"extra"}} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), append([]string{"-pg-failover"}, args...), &out, &errOut)
		if cli.ExitCode(err) != 2 {
			t.Errorf("%q: %v (exit %d, want 2)", args, err, cli.ExitCode(err))
		}
	}
	t.Setenv("JETINBOX_PG_AUTOCTL", "/nonexistent/pg_autoctl")
	var out, errOut bytes.Buffer
	err := Main(context.Background(), []string{"-pg-failover", "-intents", "10"}, &out, &errOut)
	if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "postgresql-15-auto-failover") || !strings.Contains(err.Error(), "pg-auto-failover-cli") {
		t.Errorf("without pg_autoctl: %v (exit %d), want exit 2 naming the packages", err, cli.ExitCode(err))
	}
}
