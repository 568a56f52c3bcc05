package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestWriteStagesSteps: the transaction's steps are printed under it, the
// p99 message's steps and batch after its wait points; without steps
// (a processor that does not record them) their rows are left out.
func TestWriteStagesSteps(t *testing.T) {
	ms := time.Millisecond
	times := make([]stageTimes, 100)
	for i := range times {
		d := time.Duration(i+1) * ms
		times[i] = stageTimes{Fetch: d, Tx: 5 * d, Begin: d, Claim: d, Turn: d, Effect: d, CommitStep: d, Batch: i%3 + 1}
	}
	var out bytes.Buffer
	writeStages(&out, "", times)
	for _, want := range []string{
		"  BEGIN (on SQLite also the wait for the one writer) ", "  claim (the inbox rows) ", "  the effect's turn (the batch before holds it to its COMMIT) ",
		"  COMMIT (the database's commit and flush)       ", "its transaction (a batch of 3): BEGIN 99ms, claim 99ms, the effect's turn 99ms, effect 99ms, COMMIT 99ms",
		"batch size as its messages saw it: p50 2  p99 3  max 3",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for i := range times {
		times[i].Begin, times[i].Claim, times[i].Turn, times[i].Effect, times[i].CommitStep = 0, 0, 0, 0, 0
	}
	out.Reset()
	writeStages(&out, "", times)
	if strings.Contains(out.String(), "BEGIN") {
		t.Errorf("steps printed without any recorded:\n%s", out.String())
	}
}
