// One attempt at a batch, step by step: claim, classify, apply, decide,
// record, commit, in one transaction.

package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/internal/hook"
)

// batch is one attempt at a batch, step by step: claim, classify, apply,
// record, commit.
type batch struct {
	msgs  []Message
	valid []int     // indexes into msgs of the messages to claim
	out   []Outcome // one per message, filled in as the steps decide

	fresh     []Message // claimed now: apply their effects
	freshIdx  []int     // their indexes into msgs
	conflicts []int
	// inBatch pairs a copy of an ID with its first copy in the batch
	// (indexes into msgs); refused marks messages whose claim the
	// database refused.
	inBatch [][2]int
	refused map[int]bool
	// prior: some outcome rests on a row an earlier commit wrote (a
	// duplicate, a rejection or conflict found in the inbox).
	prior bool
}

func (p *Processor[TX]) processOnce(ctx context.Context, msgs []Message, valid []int, out []Outcome, isolate, fast bool) (err error) {
	st := stepTimes(ctx)
	if st != nil {
		*st = StepTimes{}
	}
	tx, err := p.store.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: begin: %w", err)
	}
	st.mark(stepBegun)
	defer func() {
		if err != nil {
			_ = p.store.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	if p.fires(hook.BeforeClaim) {
		return &hook.Crash{Point: hook.BeforeClaim}
	}

	b := &batch{msgs: msgs, valid: valid, out: out}
	defer func() { putMessages(b.fresh) }()
	res, err := p.claim(ctx, tx, b, isolate, fast)
	if err != nil {
		return err
	}
	p.classify(b, res)
	st.mark(stepClaimed)

	// Take a turn for the effect. The turn ends where the COMMIT starts:
	// the next batch's effect then runs while this one commits. Where it
	// touches a row this batch changed, it waits in the database for this
	// COMMIT (see Config.EffectConcurrency); where it does not (most
	// batches of one message at low load), it no longer waits for a
	// COMMIT and its flush.
	select {
	case p.turns <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	turn := true
	endTurn := func() {
		if turn {
			turn = false
			<-p.turns
		}
	}
	defer endTurn()
	st.mark(stepTurn)

	errs, err := p.apply(ctx, tx, b.fresh, isolate)
	if err != nil {
		return err
	}
	if p.fires(hook.BeforeCommit) {
		return &hook.Crash{Point: hook.BeforeCommit}
	}
	rejIDs, rejReasons, retryIDs := p.decide(b, errs)
	if err := p.record(ctx, tx, msgs, rejIDs, rejReasons, retryIDs, b.conflicts); err != nil {
		return err
	}
	if err := p.readPrior(ctx, tx, b); err != nil {
		return err
	}
	st.mark(stepApplied)
	endTurn()
	if err := p.commit(ctx, tx, len(valid)); err != nil {
		return err
	}
	st.mark(stepCommitted)
	return nil
}

// priorReader is a store whose commit of a transaction that wrote nothing
// returns before the commits it read are durable (PostgreSQL's
// read-only COMMIT waits for no flush and no standby): ReadPriorCommits
// makes it wait as a writing commit does.
type priorReader[TX any] interface {
	ReadPriorCommits(ctx context.Context, tx TX) error
}

// readPrior makes the commit of a batch whose acks rest on rows committed
// before, and that claimed nothing itself, wait until those rows are as
// durable as its own fresh commit would be: the row a redelivery finds may
// be one whose commit the synchronous standby never confirmed. A batch
// that claimed a message wrote its row, so its commit waits anyway.
func (p *Processor[TX]) readPrior(ctx context.Context, tx TX, b *batch) error {
	if !b.prior || len(b.fresh) > 0 {
		return nil
	}
	r, ok := any(p.store).(priorReader[TX])
	if !ok {
		return nil
	}
	if err := r.ReadPriorCommits(ctx, tx); err != nil {
		return fmt.Errorf("inbox: read prior commits: %w", err)
	}
	return nil
}

// claim claims the batch's valid messages: with COPY when fast (every
// claim is then fresh and res is nil), else with the store's Claim; in isolation
// one message at a time, so that a claim the database refuses rejects only
// its own message. A claim refused outside isolation fails the batch with
// errIsolate.
func (p *Processor[TX]) claim(ctx context.Context, tx TX, b *batch, isolate, fast bool) (res []driver.ClaimResult, err error) {
	claims := getClaims(len(b.valid))
	defer putClaims(claims)
	for k, i := range b.valid {
		m := &b.msgs[i]
		claims[k] = driver.Claim{ID: m.ID, Fingerprint: Fingerprint(m.Payload), StreamSeq: m.StreamSeq, Subject: m.Subject}
	}
	end := p.span(ctx, "jetinbox.claim", len(claims))
	defer func() { end(err) }()
	if isolate {
		var refused []error
		res, refused, err = p.claimEach(ctx, tx, claims)
		for k, e := range refused {
			if e != nil {
				i := b.valid[k]
				b.out[i] = Outcome{Status: StatusRejected, Cause: CauseClaimRefused, Reason: SanitizeReason(e.Error()), Err: e}
				if b.refused == nil {
					b.refused = map[int]bool{}
				}
				b.refused[i] = true
			}
		}
		return res, err
	}
	var order []int
	if fast {
		order = sortedUnique(claims)
	}
	if order != nil {
		if err := p.store.ClaimNew(ctx, tx, p.cfg.Scope, claims, order); err != nil {
			if p.store.Classify(err) == driver.ErrorData && !errors.Is(err, driver.ErrClaimedBefore) {
				return nil, fmt.Errorf("%w: %w", errIsolate, err)
			}
			return nil, err
		}
		p.copyClaims.Add(1) // every claim is fresh; res stays nil
		return nil, nil
	}
	res, err = p.store.Claim(ctx, tx, p.cfg.Scope, claims)
	if err != nil && p.store.Classify(err) == driver.ErrorData {
		return nil, fmt.Errorf("%w: %w", errIsolate, err)
	}
	return res, err
}

// claimPool keeps the claim slices of finished batches for the next ones.
var claimPool sync.Pool

// getClaims returns a slice of n claims to fill in.
func getClaims(n int) []driver.Claim {
	if p, ok := claimPool.Get().(*[]driver.Claim); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]driver.Claim, n)
}

// putClaims returns claims to the pool, cleared. The stores are done with
// a claim slice when their call returns: they copy what they send.
func putClaims(claims []driver.Claim) {
	clear(claims)
	claimPool.Put(&claims)
}

// messagePool keeps the slices of fresh messages handed to the handler, so
// that a batch of 6,000 does not allocate 600 KB for them.
var messagePool sync.Pool

// getMessages returns a slice of n messages to overwrite.
func getMessages(n int) []Message {
	if p, ok := messagePool.Get().(*[]Message); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]Message, n)
}

// putMessages returns msgs to the pool, cleared of payloads. The handler is
// done with them when the batch's attempt ends.
func putMessages(msgs []Message) {
	if cap(msgs) == 0 {
		return
	}
	msgs = msgs[:cap(msgs)]
	clear(msgs)
	messagePool.Put(&msgs)
}

// classify sorts the claimed messages: fresh ones to apply, duplicates and
// conflicts decided now, copies of an earlier message of the batch decided
// with it.
func (p *Processor[TX]) classify(b *batch, res []driver.ClaimResult) {
	if res == nil && b.refused == nil && len(b.valid) == len(b.msgs) {
		// Every message claimed fresh (the COPY claim of a batch of
		// first deliveries): all of them go to the handler, in a copy
		// of its own from the pool.
		b.fresh = append(getMessages(len(b.msgs))[:0], b.msgs...)
		b.freshIdx = b.valid
		return
	}
	b.fresh = getMessages(len(b.valid))[:0]
	b.freshIdx = make([]int, 0, len(b.valid))
	for k, i := range b.valid {
		if b.refused[i] {
			continue
		}
		r := driver.ClaimResult{State: driver.ClaimFresh}
		if res != nil {
			r = res[k]
		}
		if r.InBatch && r.State == driver.ClaimDuplicate {
			b.inBatch = append(b.inBatch, [2]int{i, b.valid[r.First]})
			continue
		}
		if r.State != driver.ClaimFresh {
			b.prior = true
		}
		switch r.State {
		case driver.ClaimFresh:
			b.fresh = append(b.fresh, b.msgs[i])
			b.freshIdx = append(b.freshIdx, i)
		case driver.ClaimDuplicate:
			b.out[i] = Outcome{Status: StatusDuplicate, AlreadyInInbox: true, FirstSeq: r.PriorSeq}
			if r.PriorStatus == driver.RowRejected {
				b.out[i] = Outcome{Status: StatusRejected, Cause: CauseRejectedBefore, Reason: SanitizeReason(r.PriorReason), AlreadyInInbox: true, FirstSeq: r.PriorSeq}
			}
		case driver.ClaimConflict:
			b.out[i] = Outcome{Status: StatusConflict, Cause: CauseConflict, AlreadyInInbox: true, Reason: b.conflictReason(i, r)}
			b.conflicts = append(b.conflicts, i)
		}
	}
}

// conflictReason says what differs between message i and the intent that
// claimed its ID first: the payload, the subject, or both.
func (b *batch) conflictReason(i int, r driver.ClaimResult) string {
	prior := r.PriorSubject
	if r.InBatch {
		prior = b.msgs[r.First].Subject
	}
	if prior == b.msgs[i].Subject {
		return "message ID reused with a different payload (fingerprint mismatch)"
	}
	return fmt.Sprintf("message ID reused on another subject (claimed on %q)", truncateSubject(prior))
}

// apply runs the handler on the fresh messages, all at once or, in
// isolation, one at a time under savepoints. errs[j] is fresh[j]'s own
// error.
func (p *Processor[TX]) apply(ctx context.Context, tx TX, fresh []Message, isolate bool) (errs []error, err error) {
	errs = make([]error, len(fresh))
	if len(fresh) == 0 {
		return errs, nil
	}
	end := p.span(ctx, "jetinbox.effect", len(fresh))
	defer func() { end(err) }()
	if isolate {
		return errs, p.handleIsolated(ctx, tx, fresh, errs)
	}
	if err := p.handle(ctx, tx, fresh, errs); err != nil {
		if k := p.store.Classify(err); k == driver.ErrorRetryTx || k == driver.ErrorConn {
			// The whole batch is retried: one message at a time would
			// only meet the same deadlock, connection or deployment.
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", errIsolate, err)
	}
	return errs, nil
}

// decide turns the effects' errors into outcomes and lists the rows to
// mark rejected and the claims to release for a retry.
func (p *Processor[TX]) decide(b *batch, errs []error) (rejIDs, rejReasons, retryIDs []string) {
	msgs, out := b.msgs, b.out
	for j, i := range b.freshIdx {
		e := errs[j]
		switch {
		case e == nil:
			out[i] = Outcome{Status: StatusApplied}
		case IsPermanent(e):
			out[i] = Outcome{Status: StatusRejected, Cause: rejectCause(e), Reason: SanitizeReason(e.Error()), Err: e}
		case p.store.Classify(e) == driver.ErrorConn:
			// The database's or the deployment's fault, reported for one
			// message: retried, on its last delivery too.
			out[i] = Outcome{Status: StatusRetry, Cause: CauseTransient, Reason: SanitizeReason(e.Error()), Err: e, NotMessageFault: true}
			retryIDs = append(retryIDs, msgs[i].ID)
			continue
		case msgs[i].Final:
			reason := fmt.Sprintf("gave up after %d deliveries: %v", msgs[i].Deliveries, e)
			out[i] = Outcome{Status: StatusRejected, Cause: CauseGaveUp, Reason: SanitizeReason(reason), Err: e}
		default:
			out[i] = Outcome{Status: StatusRetry, Cause: CauseTransient, Reason: SanitizeReason(e.Error()), Err: e}
			retryIDs = append(retryIDs, msgs[i].ID)
			continue
		}
		if out[i].Status == StatusRejected {
			rejIDs = append(rejIDs, msgs[i].ID)
			rejReasons = append(rejReasons, out[i].Reason)
		}
	}
	// A copy of a message that appeared earlier in the batch shares the
	// first copy's fate: acked only if the first committed its effect; a
	// repeat of a rejected intent, dead-lettered as the first copy, unless
	// the database refused the first copy's claim (no inbox row: each copy
	// is dead-lettered).
	for _, d := range b.inBatch {
		o := out[d[1]]
		switch o.Status {
		case StatusApplied, StatusDuplicate:
			o = Outcome{Status: StatusDuplicate, FirstSeq: msgs[d[1]].StreamSeq}
		case StatusRejected:
			o.AlreadyInInbox = false
			if o.FirstSeq == 0 && !b.refused[d[1]] {
				o.FirstSeq = msgs[d[1]].StreamSeq
			}
		case StatusConflict:
			o.AlreadyInInbox = false // each conflicting message is dead-lettered
		}
		out[d[0]] = o
	}
	return rejIDs, rejReasons, retryIDs
}

// commit commits under a context the caller cannot cancel, bounded by
// CommitTimeout, and tells a rollback from an unknown outcome.
func (p *Processor[TX]) commit(ctx context.Context, tx TX, n int) error {
	endCommit := p.span(ctx, "jetinbox.commit", n)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.CommitTimeout)
	err := p.store.Commit(cctx, tx)
	cancel()
	endCommit(err)
	if err != nil {
		if p.store.CommitRolledBack(err) {
			return fmt.Errorf("inbox: commit rolled back: %w", err)
		}
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	if p.fires(hook.AfterCommit) {
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, &hook.Crash{Point: hook.AfterCommit})
	}
	return nil
}

// noSpan ends no span.
func noSpan(error) {}

// span starts a child span when tracing and returns its end function.
func (p *Processor[TX]) span(ctx context.Context, name string, n int) func(error) {
	if p.tracer == nil {
		return noSpan // a closure here would capture the generic dictionary: one allocation per span
	}
	_, s := p.tracer.Start(ctx, name, trace.WithAttributes(attribute.Int("jetinbox.messages", n)))
	return func(err error) {
		if err != nil {
			s.SetStatus(codes.Error, err.Error())
		}
		s.End()
	}
}

// record writes rejections, releases the claims of messages to retry and logs
// conflicts, each with one statement, all in the batch's transaction.
func (p *Processor[TX]) record(ctx context.Context, tx TX, msgs []Message, rejIDs, rejReasons, retryIDs []string, conflicts []int) error {
	if len(rejIDs) > 0 {
		if err := p.store.MarkRejected(ctx, tx, p.cfg.Scope, rejIDs, rejReasons); err != nil {
			return fmt.Errorf("inbox: record rejections: %w", err)
		}
	}
	if len(retryIDs) > 0 {
		if err := p.store.ReleaseClaims(ctx, tx, p.cfg.Scope, retryIDs); err != nil {
			return fmt.Errorf("inbox: release retried claims: %w", err)
		}
	}
	if len(conflicts) > 0 {
		cs := make([]driver.Claim, len(conflicts))
		for k, i := range conflicts {
			cs[k] = driver.Claim{ID: msgs[i].ID, Fingerprint: Fingerprint(msgs[i].Payload), StreamSeq: msgs[i].StreamSeq, Subject: msgs[i].Subject}
		}
		if err := p.store.RecordConflicts(ctx, tx, p.cfg.Scope, cs); err != nil {
			return fmt.Errorf("inbox: record conflicts: %w", err)
		}
	}
	return nil
}
