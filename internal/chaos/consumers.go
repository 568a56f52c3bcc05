// The consumer strategies (ack-first, effect-then-ack, jetinbox), the
// supervisor that restarts their workers, and the give-up nobody hears.

package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/failpoint"
	"github.com/jetinbox/jetinbox/internal/hook"
)

// supervise runs a worker and starts it again when it crashes. Besides the
// random faults, every combination meets the same planned ones: the naive
// strategies lose the acks of the run's second batch and die at their worst
// crash point on its third; jetinbox's worker 0 dies after a COMMIT on its
// third batch and worker 1 before a COMMIT on its second.
func (r *run) supervise(ctx context.Context, strategy, durable string, worker int) {
	for life := 0; ctx.Err() == nil; life++ {
		plan := plan{crashAt: -1, loseAcksAt: -1}
		if life == 0 && worker == 0 {
			plan.crashAt = 3
		}
		if life == 0 && worker == 1 {
			plan.loseAcksAt = 2
		}
		var err error
		switch strategy {
		case "jetinbox":
			err = r.runJetinbox(ctx, durable, plan)
		default:
			err = r.runNaive(ctx, strategy, durable)
		}
		if err != nil && ctx.Err() == nil && !errors.Is(err, errCrashed) && !failpoint.IsCrash(err) {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

var errCrashed = errors.New("crashed")

// plan holds the planned faults of one worker life: batch numbers, -1 for none.
type plan struct{ crashAt, loseAcksAt int }

// runNaive is a consumer without an inbox: ack-first acks a batch and then
// applies it; effect-then-ack applies it in one transaction, then acks.
func (r *run) runNaive(ctx context.Context, strategy, durable string) error {
	c, err := r.js.Consumer(ctx, r.stream, durable)
	if err != nil {
		return err
	}
	ledger := effects.NewLedger()
	for ctx.Err() == nil {
		batch, err := c.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			return err
		}
		var msgs []jetstream.Msg
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if len(msgs) == 0 {
			continue
		}
		// The planned faults go to the run's 2nd and 3rd batches, whichever
		// worker takes them, so that a worker restarted early (a NATS
		// restart, a fetch error) cannot skip them.
		seq := r.batches.Add(1)
		crash := seq == 3 || r.roll(r.o.Crash)
		loseAcks := seq == 2
		if crash && strategy == "ack-first" {
			r.fault("crashes")
			r.ackAll(msgs, loseAcks) // acked, then died before the effect
			return errCrashed
		}
		if crash && strategy == "effect-then-ack" && seq != 3 && r.roll(0.5) {
			r.fault("crashes")
			return errCrashed // died after fetch, before the effect
		}
		if strategy == "ack-first" {
			r.ackAll(msgs, loseAcks)
		}
		im := make([]inbox.Message, len(msgs))
		for i, m := range msgs {
			im[i] = jsinbox.InboxMessage(m)
		}
		tx, err := r.pool.Begin(ctx)
		if err != nil {
			continue // no ack: redelivered (unless acked first: lost)
		}
		errs := make([]error, len(im))
		if err := ledger.Handle(ctx, tx, im, errs); err != nil {
			_ = tx.Rollback(ctx)
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			continue
		}
		if strategy == "effect-then-ack" {
			if crash {
				r.fault("crashes")
				return errCrashed // committed, died before the ack
			}
			r.ackAll(msgs, loseAcks)
		}
	}
	return nil
}

func (r *run) ackAll(msgs []jetstream.Msg, lose bool) {
	if lose || r.roll(r.o.LoseAck) {
		r.fault("lost acks")
		return
	}
	for _, m := range msgs {
		_ = m.Ack()
	}
}

// runJetinbox runs the real consumer with its crash points armed by the
// dice: one failpoint set per worker life.
func (r *run) runJetinbox(ctx context.Context, durable string, pl plan) error {
	fp := failpoint.New()
	switch {
	case pl.crashAt > 0:
		fp.EnableEvery(failpoint.AfterCommit, pl.crashAt, 1)
	case pl.loseAcksAt > 0:
		fp.EnableEvery(failpoint.BeforeCommit, pl.loseAcksAt, 1)
	case r.roll(r.o.Crash * 3):
		points := []hook.Point{failpoint.BeforeClaim, failpoint.BeforeCommit, failpoint.AfterCommit}
		r.diceMu.Lock()
		p := points[r.dice.IntN(len(points))]
		n := 1 + r.dice.IntN(10)
		r.diceMu.Unlock()
		fp.EnableEvery(p, n, 1)
	}
	if pl.loseAcksAt > 0 {
		fp.EnableEvery(failpoint.SkipAck, pl.loseAcksAt, 1)
	} else if r.o.LoseAck > 0 {
		fp.EnableEvery(failpoint.SkipAck, max(1, int(1/r.o.LoseAck)), -1)
	}
	// The scope is the effect's identity, the durable only the
	// subscription: NewLedger writes under the default scope.
	proc, err := inbox.NewProcessor(pginbox.New(r.pool), effects.NewLedger(), inbox.Config{Scope: effects.DefaultScope})
	if err != nil {
		return err
	}
	c, err := jsinbox.NewConsumer(r.js, proc, jsinbox.ConsumerConfig{Durable: durable, BatchSize: 100})
	if err != nil {
		return err
	}
	fp.Attach(proc, c)
	err = c.Run(ctx)
	if n := fp.Hits(failpoint.SkipAck); n > 0 {
		r.faults["lost acks"].Add(int64(n))
	}
	if failpoint.IsCrash(err) {
		r.fault("crashes")
	}
	return err
}

// giveUpUnheard is the planned fault "a crash on the last delivery while
// nobody listens": before any worker runs, a client takes every message in
// the stream (the first intents) through every delivery the durable allows (naking each at once)
// and hangs on the last one with a pull request outstanding. When AckWait
// runs out the server tries that request, gives up on them all and
// announces it once, on core NATS, with nobody subscribed. Workers started
// later must still settle them.
func (r *run) giveUpUnheard(ctx context.Context, nc *nats.Conn, durable string) error {
	c, err := r.js.Consumer(ctx, r.stream, durable)
	if err != nil {
		return err
	}
	// What the producer got into the stream: fewer than it tried when it
	// publishes once and loses some, more when it retries with fresh IDs.
	st, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return err
	}
	n := int(st.CachedInfo().State.Msgs)
	if n == 0 {
		return nil
	}
	maxDeliver := c.CachedInfo().Config.MaxDeliver
	// Take every message again and again, naking it at once, until each
	// was delivered MaxDeliver times; keep it unsettled then.
	last := map[uint64]bool{}
	deadline := time.Now().Add(time.Minute)
	for len(last) < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("give-up fault: %d of %d messages reached their last delivery within a minute", len(last), n)
		}
		b, err := c.Fetch(n, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		for m := range b.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			if md.NumDelivered >= uint64(maxDeliver) {
				last[md.Sequence.Stream] = true
				continue
			}
			_ = m.Nak()
		}
	}
	dead, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		return err
	}
	req := fmt.Sprintf(`{"batch":%d,"expires":%d}`, n, int64(10*time.Second))
	if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+r.stream+"."+durable, dead.Subject, []byte(req)); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	// The request's subscriber stays until the server has given up (it
	// drops a request nobody can receive), taking what comes and settling
	// nothing, as a process that hangs does.
	defer dead.Unsubscribe() //nolint:errcheck // best effort
	// Wait until the server has given up on all of them.
	adv, err := r.js.Stream(ctx, jsinbox.AdvisoryStream(r.stream))
	if err != nil {
		return err
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		info, err := adv.Info(ctx)
		if err == nil && info.State.Msgs >= uint64(n) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("give-up fault: the server gave up on %d of %d messages in time (%v)", info.State.Msgs, n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.faults["unheard give-ups"].Add(int64(n))
	return nil
}
