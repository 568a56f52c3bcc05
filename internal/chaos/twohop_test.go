package chaos

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/internal/cli"
)

// TestTwoHopSmoke is the CI-sized two-hop run: both hops lose, duplicate
// and add nothing under consumer crashes at every point, relays dying
// between COMMIT and publish, in the PubAck wait and between publish and
// mark, lost PubAcks and acks, and a NATS and a PostgreSQL restart; verify
// on both hops and the chain check are clean.
func TestTwoHopSmoke(t *testing.T) { t.Parallel(); twoHopSmoke(t, "postgres") }

// TestTwoHopSmokeSQLite is TestTwoHopSmoke on a SQLite file: the ledger's
// follow-ups go to the SQLite outbox in the inbox transaction, two relays
// lease batches from it and die at each point, and the chain check reads
// the file. No database restart there. Its relays publish fast batches
// (the PostgreSQL run's publish atomic ones): one dies in the middle of
// its batch, PubAcks are lost, the nats-server restarts under them.
func TestTwoHopSmokeSQLite(t *testing.T) { t.Parallel(); twoHopSmoke(t, "sqlite", "fast") }

func twoHopSmoke(t *testing.T, store string, publish ...string) {
	o := Options{Intents: 600, DropPublish: 0.03, LosePubAck: 0.03, Crash: 0.05, LoseAck: 0.05,
		Poison: 0.01, Restarts: true, Seed: 11, Store: store}
	if len(publish) > 0 {
		o.RelayPublish = publish[0]
	}
	th, err := RunTwoHop(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	WriteTwoHop(&b, th)
	t.Logf("%s", b.String())
	if len(th.Rows) != 2 {
		t.Fatalf("%d rows", len(th.Rows))
	}
	one, two := th.Rows[0], th.Rows[1]
	if one.Lost != 0 || one.Duplicated != 0 || one.Unexpected != 0 || one.AppliedOnce != 594 || one.DeadLettered != 6 {
		t.Errorf("hop 1: %+v", one)
	}
	if two.Lost != 0 || two.Duplicated != 0 || two.Unexpected != 0 || two.Intents != 594 || two.AppliedOnce != 594 {
		t.Errorf("hop 2: %+v", two)
	}
	if !th.Clean() {
		t.Error("a check found violations")
	}
	if th.Chain.InStream != 594 || th.Chain.Pending != 0 {
		t.Errorf("chain: %+v", th.Chain)
	}
	for _, f := range []string{"relay crashes before publish", "relay crashes in PubAck wait", "relay crashes before mark"} {
		if !bytes.Contains(b.Bytes(), []byte(f)) || bytes.Contains(b.Bytes(), []byte(" 0 "+f)) {
			t.Errorf("the run had no %s", f)
		}
	}
}

// TestStoreFlag: -store takes postgres or sqlite; anything else is a usage
// error before any server starts.
func TestStoreFlag(t *testing.T) {
	for _, store := range []string{"mysql", "sqlite:///x.db", "SQLite "} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), []string{"-store", store}, &out, &errOut)
		if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "-store") {
			t.Errorf("-store %q: %v (exit %d, want 2 naming -store)", store, err, cli.ExitCode(err))
		}
	}
}
