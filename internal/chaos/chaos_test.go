package chaos

import (
	"bytes"
	"context"
	"testing"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestChaosSmoke is the CI-sized chaos run: every producer strategy × every
// consumer strategy under the same faults. Only stable IDs plus the inbox
// may come out clean, and the other rows must show the losses and
// duplicates their strategy invites: the harness can see what it claims to
// check.
func TestChaosSmoke(t *testing.T) {
	rows, rep, err := Run(context.Background(), Options{
		Intents: 300, Producers: Producers, Consumers: Consumers,
		DropPublish: 0.03, LosePubAck: 0.03, Crash: 0.05, LoseAck: 0.05, Restarts: true, Seed: 7,
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
	if r := get("stable-id", "jetinbox"); r.Lost != 0 || r.Duplicated != 0 || r.AppliedOnce != 300 {
		t.Errorf("stable-id × jetinbox: lost=%d duplicated=%d applied once=%d", r.Lost, r.Duplicated, r.AppliedOnce)
	}
	if rep == nil || !rep.Clean() {
		t.Errorf("verify on the final state: %+v", rep)
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
