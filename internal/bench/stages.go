// Publish-to-commit split by stage: where a message waits at low load.

package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// stageTimes is one message's way from the publisher to its ack.
type stageTimes struct {
	// Publish: the publisher handing it to the client to the stream's
	// timestamp (stored). Fetch: stored to the consumer's client handing
	// it over. Wait: received to its batch's transaction starting (the
	// batcher and a free slot). Tx: the transaction, to after COMMIT.
	// Ack: COMMIT to its batch's acks handed to the connection.
	Publish, Fetch, Wait, Tx, Ack time.Duration
	// The transaction's steps, each the batch's: BEGIN, the claim, the
	// wait for the effect's turn (the batch before holds it to its
	// COMMIT), the effect (with rejections recorded), COMMIT. Zero when
	// the processor does not record them.
	Begin, Claim, Turn, Effect, CommitStep time.Duration
	// Batch is the number of messages in the message's batch.
	Batch int
}

// Commit is stored to COMMIT: the figure the latency line reports.
func (s stageTimes) Commit() time.Duration { return s.Fetch + s.Wait + s.Tx }

// stageObserver is the latency phase's observer: it counts as
// countObserver does and records each acked message's stages.
type stageObserver struct {
	*countObserver
	sent  []atomic.Int64 // by intent, when published (Unix ns)
	index map[string]int // intent ID to its index in sent
	mu    sync.Mutex
	times []stageTimes
}

func newStageObserver(c *countObserver, ids []string) *stageObserver {
	o := &stageObserver{countObserver: c, sent: make([]atomic.Int64, len(ids)), index: make(map[string]int, len(ids))}
	for i, id := range ids {
		o.index[id] = i
	}
	return o
}

// published records that intent i was handed to the publisher now.
func (o *stageObserver) published(i int) { o.sent[i].Store(time.Now().UnixNano()) }

// ObserveAcked implements jsinbox.AckObserver.
func (o *stageObserver) ObserveAcked(b jsinbox.BatchReport) {
	var add []stageTimes
	for i, out := range b.Outcomes {
		if !out.Ackable() || i >= len(b.Received) {
			continue
		}
		m := b.Messages[i]
		st := stageTimes{Fetch: b.Received[i].Sub(m.Published), Wait: b.Began.Sub(b.Received[i]), Tx: b.Ended.Sub(b.Began), Ack: b.Acked.Sub(b.Ended), Batch: len(b.Messages)}
		if s := b.Steps; !s.Committed.IsZero() {
			st.Begin, st.Claim, st.Turn = s.Begun.Sub(b.Began), s.Claimed.Sub(s.Begun), s.Turn.Sub(s.Claimed)
			st.Effect, st.CommitStep = s.Applied.Sub(s.Turn), s.Committed.Sub(s.Applied)
		}
		if k, ok := o.index[m.ID]; ok {
			if ns := o.sent[k].Load(); ns != 0 {
				st.Publish = m.Published.Sub(time.Unix(0, ns))
			}
		}
		add = append(add, st)
	}
	o.mu.Lock()
	o.times = append(o.times, add...)
	o.mu.Unlock()
}

func (o *stageObserver) all() []stageTimes {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.times)
}

// writeStages prints p50, p99 and max of each stage, and the stages of the
// message at the p99 of stored-to-commit: where that one waited.
func writeStages(w io.Writer, indent string, times []stageTimes) {
	if len(times) == 0 {
		return
	}
	col := func(f func(stageTimes) time.Duration) []time.Duration {
		out := make([]time.Duration, len(times))
		for i, t := range times {
			out[i] = f(t)
		}
		return out
	}
	stages := []struct {
		name string
		f    func(stageTimes) time.Duration
	}{
		{"publish → stored (the producer's publish, the server storing it)", func(t stageTimes) time.Duration { return t.Publish }},
		{"stored → received (delivery to the consumer's pull)", func(t stageTimes) time.Duration { return t.Fetch }},
		{"received → transaction start (batcher, a free slot)", func(t stageTimes) time.Duration { return t.Wait }},
		{"transaction start → COMMIT done (claim, effect, commit)", func(t stageTimes) time.Duration { return t.Tx }},
		{"  BEGIN (on SQLite also the wait for the one writer)", func(t stageTimes) time.Duration { return t.Begin }},
		{"  claim (the inbox rows)", func(t stageTimes) time.Duration { return t.Claim }},
		{"  the effect's turn (the batch before holds it to its COMMIT)", func(t stageTimes) time.Duration { return t.Turn }},
		{"  effect (and rejections recorded)", func(t stageTimes) time.Duration { return t.Effect }},
		{"  COMMIT (the database's commit and flush)", func(t stageTimes) time.Duration { return t.CommitStep }},
		{"COMMIT → acks sent", func(t stageTimes) time.Duration { return t.Ack }},
		{"stored → COMMIT (the latency line)", stageTimes.Commit},
	}
	fmt.Fprintf(w, "%s  %-60s %8s  %8s  %8s\n", indent, fmt.Sprintf("stage (%d messages)", len(times)), "p50", "p99", "max")
	steps := slices.ContainsFunc(times, func(t stageTimes) bool { return t.CommitStep != 0 })
	for _, s := range stages {
		if strings.HasPrefix(s.name, "  ") && !steps {
			continue
		}
		d := col(s.f)
		fmt.Fprintf(w, "%s  %-60s %8v  %8v  %8v\n", indent, s.name, pct(d, 50), pct(d, 99), pct(d, 100))
	}
	sorted := slices.Clone(times)
	slices.SortFunc(sorted, func(a, b stageTimes) int { return int(a.Commit() - b.Commit()) })
	p := sorted[max(0, min(len(sorted)-1, (len(sorted)*99+99)/100-1))]
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	fmt.Fprintf(w, "%sthe p99 message's wait points: published, stored after %v, received after %v, its transaction began after %v, committed after %v, acked after %v\n",
		indent, r(p.Publish), r(p.Fetch), r(p.Wait), r(p.Tx), r(p.Ack))
	if steps {
		fmt.Fprintf(w, "%s  its transaction (a batch of %d): BEGIN %v, claim %v, the effect's turn %v, effect %v, COMMIT %v\n",
			indent, p.Batch, r(p.Begin), r(p.Claim), r(p.Turn), r(p.Effect), r(p.CommitStep))
	}
	sizes := make([]int, len(times))
	for i, t := range times {
		sizes[i] = t.Batch
	}
	slices.Sort(sizes)
	q := func(pc int) int { return sizes[max(0, min(len(sizes)-1, (len(sizes)*pc+99)/100-1))] }
	fmt.Fprintf(w, "%sbatch size as its messages saw it: p50 %d  p99 %d  max %d\n", indent, q(50), q(99), sizes[len(sizes)-1])
}
