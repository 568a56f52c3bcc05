package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/jitter"
)

// Beginner starts a transaction. *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Handler applies the side effects of freshly claimed messages inside the
// inbox transaction.
//
// Handle gets every fresh message of a batch and sets errs[i] (len(errs) ==
// len(msgs)) for each message it did not apply; an error wrapped with
// [Permanent] rejects that message, any other error retries it later. For a
// message with errs[i] set, Handle must have written nothing, and the
// transaction must still be usable: validate before writing.
//
// A non-nil return value means the batch as a whole failed (for example a
// statement aborted the transaction). The processor then rolls back and
// applies the batch one message at a time, each under a savepoint, so that
// one poison message cannot take its neighbours down. Deadlocks and
// serialization failures retry the whole batch instead.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, msgs []Message, errs []error) error
}

// HandlerFunc adapts a function that applies one message to a [Handler].
// It is the simple way in; a set-based Handler is faster for big batches.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, msg Message) error

// Handle implements [Handler]. The first error fails the batch, since a
// failed statement may have aborted the transaction; the processor then
// applies the messages one at a time under savepoints and reports each
// message's own error.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, msgs []Message, errs []error) error {
	for i := range msgs {
		if err := f(ctx, tx, msgs[i]); err != nil {
			if len(msgs) == 1 {
				return err
			}
			return fmt.Errorf("message %q: %w", msgs[i].ID, err)
		}
	}
	return nil
}

// Config configures a [Processor].
type Config struct {
	// Scope names the consuming worker: the inbox key is (Scope, message
	// ID), so two workers with different scopes each apply a message once.
	// The scope is the identity of the effect, not of the subscription:
	// keep it when a durable is renamed or re-created, or the stream is
	// applied again. Handlers read it with [ScopeFromContext]. Required.
	Scope string
	// Handler applies the effects. Required.
	Handler Handler
	// Logger receives debug lines about isolation and retries. Default: no
	// logging.
	Logger *slog.Logger
	// TxRetry times the in-process retries of a batch after a deadlock or
	// serialization failure and bounds them (MaxAttempts); after that the
	// batch is reported as retry. Default: full jitter from 5ms to 200ms,
	// 3 retries.
	TxRetry jitter.Policy
	// TracerProvider, when set, traces each batch's claim, effect and
	// commit as children of the span in Process's context. Default: none.
	TracerProvider trace.TracerProvider
	// CommitTimeout bounds a COMMIT, which runs under a context the caller
	// cannot cancel: on a half-open connection it would otherwise wait for
	// TCP keepalive. A timed-out commit is outcome unknown. Default 30s.
	CommitTimeout time.Duration
	// EffectConcurrency is how many batches of this processor may apply
	// effects and commit at once. Claims always overlap; the effect step
	// and COMMIT take a turn. Effects that update shared rows (balances,
	// counters) serialize on row locks anyway; taking turns in-process
	// keeps them from piling up in lock waits inside PostgreSQL, where a
	// batch waiting for another holds its own rows and stalls a third.
	// Default 1; raise it for effects that touch disjoint rows.
	EffectConcurrency int
}

// WithDefaults returns a copy of c with defaults filled in.
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if r := c.TxRetry; r.Kind == 0 && r.Base == 0 && r.Cap == 0 && r.MaxAttempts == 0 {
		c.TxRetry = jitter.Policy{Kind: jitter.Full, Base: 5 * time.Millisecond, Cap: 200 * time.Millisecond, MaxAttempts: 3}
	}
	if c.CommitTimeout <= 0 {
		c.CommitTimeout = 30 * time.Second
	}
	if c.EffectConcurrency <= 0 {
		c.EffectConcurrency = 1
	}
	return c
}

func (c Config) validate() error {
	if err := ValidateID(c.Scope); err != nil {
		return fmt.Errorf("inbox: config: Scope: %w", err)
	}
	if c.Handler == nil {
		return errors.New("inbox: config: Handler is required")
	}
	if err := c.TxRetry.Validate(); err != nil {
		return fmt.Errorf("inbox: config: TxRetry: %w", err)
	}
	return nil
}

// Processor claims and applies batches of messages, one transaction per
// batch. It is safe for concurrent use; each call uses its own transaction.
type Processor struct {
	db     Beginner
	cfg    Config
	tracer trace.Tracer  // nil unless tracing
	turns  chan struct{} // effect-and-commit turns, EffectConcurrency of them
	// copyCooldown counts down the batches still to claim with conflict
	// checks after a copy claim met an existing row.
	copyCooldown  atomic.Int32
	copyClaims    atomic.Int64
	copyFallbacks atomic.Int64

	// claimCopy is the COPY claim; noCopy turns it off. Tests plant a
	// broken claim or compare both paths through them (export_test.go).
	claimCopy func(ctx context.Context, tx pgx.Tx, scope string, claims []Claim, order []int) error
	noCopy    bool
	// hook, nil unless a harness attached one (internal/hook), stops the
	// processor at named points.
	hook hook.Func
}

func init() {
	hook.Register(func(target any, f hook.Func) bool {
		p, ok := target.(*Processor)
		if ok {
			p.hook = f
		}
		return ok
	})
}

// fires reports whether the harness's hook stops the processor at pt.
func (p *Processor) fires(pt hook.Point) bool { return p.hook != nil && p.hook(pt) }

// ProcessorStats counts how batches were claimed.
type ProcessorStats struct {
	// CopyClaims: batches claimed with COPY (first deliveries, 64+
	// messages).
	CopyClaims int64
	// CopyFallbacks: batches whose COPY met an ID already claimed and that
	// were claimed again with conflict checks. A steady rate means first
	// deliveries of old IDs: a replay, or copies published after the
	// stream's duplicate window.
	CopyFallbacks int64
}

// Stats returns the counters so far.
func (p *Processor) Stats() ProcessorStats {
	return ProcessorStats{CopyClaims: p.copyClaims.Load(), CopyFallbacks: p.copyFallbacks.Load()}
}

// NewProcessor returns a Processor using db for its transactions.
func NewProcessor(db Beginner, cfg Config) (*Processor, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if db == nil {
		return nil, errors.New("inbox: NewProcessor: db is nil")
	}
	p := &Processor{db: db, cfg: cfg, turns: make(chan struct{}, cfg.EffectConcurrency), claimCopy: claimCopy}
	if cfg.TracerProvider != nil {
		p.tracer = cfg.TracerProvider.Tracer("github.com/jetinbox/jetinbox/inbox")
	}
	return p, nil
}

// Warmer is implemented by handlers that can prepare for their first batch
// (prepare statements, load caches) on a fresh connection. See
// [Processor.Warm]; it is called only on connections that cache prepared
// statements (pgx's default mode), so it may prepare them.
type Warmer interface {
	Warm(ctx context.Context, tx pgx.Tx) error
}

// Warm opens n transactions at once, so that a pool opens n connections,
// prepares the claim statements (and the handler's, if it is a [Warmer]) on
// each, and rolls them back. Run it before the first batch: a cold start
// otherwise puts connection setup and statement preparation into the
// latency of the first messages. n is capped at a pool's MaxConns, and is 1
// for a single connection. Statements are prepared only where the
// connection caches them anyway (pgx's default mode; not with a
// transaction-pooling proxy set up for exec or simple-protocol mode). Warm
// gives up after 10 seconds.
func (p *Processor) Warm(ctx context.Context, n int) error {
	switch db := p.db.(type) {
	case *pgx.Conn:
		n = 1
	case interface{ Stat() *pgxpool.Stat }:
		n = min(n, int(db.Stat().MaxConns()))
	}
	n = max(n, 1)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var ready sync.WaitGroup
	ready.Add(n)
	all := make(chan struct{})
	errs := make(chan error, n)
	for range n {
		go func() {
			tx, err := p.db.Begin(ctx)
			if err != nil {
				ready.Done()
				errs <- fmt.Errorf("inbox: warm: %w", err)
				return
			}
			err = p.prepare(ctx, tx)
			// Hold the transaction until all have begun, so the pool
			// cannot hand one connection out n times.
			ready.Done()
			<-all
			_ = tx.Rollback(context.WithoutCancel(ctx))
			errs <- err
		}()
	}
	ready.Wait()
	close(all)
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (p *Processor) prepare(ctx context.Context, tx pgx.Tx) error {
	if tx.Conn().Config().DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return nil
	}
	for _, sql := range []string{claimSQL, existingSQL} {
		if _, err := tx.Prepare(ctx, sql, sql); err != nil {
			return fmt.Errorf("inbox: warm: %w", err)
		}
	}
	if w, ok := p.cfg.Handler.(Warmer); ok {
		if err := w.Warm(ctx, tx); err != nil {
			return fmt.Errorf("inbox: warm handler: %w", err)
		}
	}
	return nil
}

// Scope returns the processor's scope.
func (p *Processor) Scope() string { return p.cfg.Scope }

var errIsolate = errors.New("inbox: batch failed; isolating messages")

// Process runs one batch in one transaction: it claims every message, applies
// the effects of the fresh ones, records rejections and conflicts, and
// commits. It returns one [Outcome] per message, in order. Only messages whose
// outcome is [Outcome.Ackable] may be acked.
//
// A non-nil error means the batch as a whole could not be committed (the
// database is unreachable, or the commit outcome is unknown, see
// [ErrOutcomeUnknown]); every outcome that is not a rejection of invalid input
// is then [StatusRetry]. The commit runs under [context.WithoutCancel], so a
// cancelled ctx cannot leave a commit half-sent.
func (p *Processor) Process(ctx context.Context, msgs []Message) ([]Outcome, error) {
	out := make([]Outcome, len(msgs))
	valid := make([]int, 0, len(msgs))
	for i := range msgs {
		if err := validateMessage(&msgs[i]); err != nil {
			out[i] = Outcome{Status: StatusRejected, Reason: err.Error(), Err: Permanent(err)}
			continue
		}
		valid = append(valid, i)
	}
	if len(valid) == 0 {
		return out, nil
	}
	isolate := false
	fast := p.copyClaimable(msgs, valid)
	var bo backoff.BackOff
	for attempt := 1; ; attempt++ {
		err := p.processOnce(ctx, msgs, valid, out, isolate, fast)
		if err == nil {
			return out, nil
		}
		if fast && errors.Is(err, errCopyClaim) {
			// Some message was there already: claim this batch, and
			// the next few, the careful way.
			p.cfg.Logger.DebugContext(ctx, "inbox: copy claim failed, claiming with conflict checks", "scope", p.cfg.Scope, "size", len(valid), "err", err)
			p.copyCooldown.Store(copyCooldownBatches)
			p.copyFallbacks.Add(1)
			fast = false
			attempt--
			continue
		}
		if errors.Is(err, errIsolate) && !isolate {
			p.cfg.Logger.DebugContext(ctx, "inbox: batch failed, applying one message at a time", "scope", p.cfg.Scope, "size", len(valid), "err", err)
			isolate = true
			fast = false
			attempt--
			continue
		}
		if isRetryableTx(err) && ctx.Err() == nil {
			if bo == nil {
				bo = p.cfg.TxRetry.NewBackOff()
			}
			if d := bo.NextBackOff(); d != backoff.Stop {
				p.cfg.Logger.DebugContext(ctx, "inbox: retrying batch", "scope", p.cfg.Scope, "attempt", attempt, "delay", d, "err", err)
				select {
				case <-time.After(d):
					continue
				case <-ctx.Done():
				}
			}
		}
		for _, i := range valid {
			out[i] = Outcome{Status: StatusRetry, Reason: err.Error(), Err: err}
		}
		return out, err
	}
}

// copyCooldownBatches is how many batches after a failed copy claim are
// claimed with conflict checks before COPY is tried again.
const copyCooldownBatches = 32

// copyClaimable reports whether a batch may be claimed with COPY: it is big
// enough for COPY to pay, every message is on its first delivery (a
// redelivery may well be claimed already), and no recent copy claim hit an
// existing row. Everything else takes [ClaimTx]. COPY is an optimisation
// only: when it meets a claimed ID the transaction is rolled back and the
// batch claimed again with ClaimTx, so both paths give the same outcomes.
func (p *Processor) copyClaimable(msgs []Message, valid []int) bool {
	if len(valid) < copyClaimThreshold || p.noCopy {
		return false
	}
	for {
		n := p.copyCooldown.Load()
		if n <= 0 {
			break
		}
		if p.copyCooldown.CompareAndSwap(n, n-1) {
			return false
		}
	}
	for _, i := range valid {
		if msgs[i].Deliveries > 1 {
			return false
		}
	}
	return true
}

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
}

func (p *Processor) processOnce(ctx context.Context, msgs []Message, valid []int, out []Outcome, isolate, fast bool) (err error) {
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if p.fires(hook.BeforeClaim) {
		return &hook.Crash{Point: hook.BeforeClaim}
	}

	b := &batch{msgs: msgs, valid: valid, out: out}
	res, err := p.claim(ctx, tx, b, isolate, fast)
	if err != nil {
		return err
	}
	p.classify(b, res)

	// Take a turn for the effect and the commit.
	select {
	case p.turns <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.turns }()

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
	return p.commit(ctx, tx, len(valid))
}

// claim claims the batch's valid messages: with COPY when fast (every
// claim is then fresh and res is nil), else with [ClaimTx]; in isolation
// one message at a time, so that a claim the database refuses rejects only
// its own message. A claim refused outside isolation fails the batch with
// errIsolate.
func (p *Processor) claim(ctx context.Context, tx pgx.Tx, b *batch, isolate, fast bool) (res []ClaimResult, err error) {
	claims := make([]Claim, len(b.valid))
	for k, i := range b.valid {
		m := &b.msgs[i]
		claims[k] = Claim{ID: m.ID, Fingerprint: Fingerprint(m.Payload), StreamSeq: m.StreamSeq, Subject: m.Subject}
	}
	end := p.span(ctx, "jetinbox.claim", len(claims))
	defer func() { end(err) }()
	if isolate {
		var refused []error
		res, refused, err = claimEach(ctx, tx, p.cfg.Scope, claims)
		for k, e := range refused {
			if e != nil {
				i := b.valid[k]
				b.out[i] = Outcome{Status: StatusRejected, Reason: e.Error(), Err: e}
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
		if err := p.claimCopy(ctx, tx, p.cfg.Scope, claims, order); err != nil {
			if isDataError(err) && !errors.Is(err, errCopyClaim) {
				return nil, fmt.Errorf("%w: %w", errIsolate, err)
			}
			return nil, err
		}
		p.copyClaims.Add(1) // every claim is fresh; res stays nil
		return nil, nil
	}
	res, err = ClaimTx(ctx, tx, p.cfg.Scope, claims)
	if err != nil && isDataError(err) {
		return nil, fmt.Errorf("%w: %w", errIsolate, err)
	}
	return res, err
}

// classify sorts the claimed messages: fresh ones to apply, duplicates and
// conflicts decided now, copies of an earlier message of the batch decided
// with it.
func (p *Processor) classify(b *batch, res []ClaimResult) {
	b.fresh = make([]Message, 0, len(b.valid))
	b.freshIdx = make([]int, 0, len(b.valid))
	for k, i := range b.valid {
		if b.refused[i] {
			continue
		}
		r := ClaimResult{State: ClaimFresh}
		if res != nil {
			r = res[k]
		}
		if r.InBatch && r.State == ClaimDuplicate {
			b.inBatch = append(b.inBatch, [2]int{i, b.valid[r.First]})
			continue
		}
		switch r.State {
		case ClaimFresh:
			b.fresh = append(b.fresh, b.msgs[i])
			b.freshIdx = append(b.freshIdx, i)
		case ClaimDuplicate:
			b.out[i] = Outcome{Status: StatusDuplicate, Redelivered: true, FirstSeq: r.PriorSeq}
			if r.PriorStatus == StatusRejected.String() {
				b.out[i] = Outcome{Status: StatusRejected, Reason: r.PriorReason, Redelivered: true, FirstSeq: r.PriorSeq}
			}
		case ClaimConflict:
			b.out[i] = Outcome{Status: StatusConflict, Redelivered: true,
				Reason: "message ID reused with a different payload (fingerprint mismatch)"}
			b.conflicts = append(b.conflicts, i)
		}
	}
}

// apply runs the handler on the fresh messages, all at once or, in
// isolation, one at a time under savepoints. errs[j] is fresh[j]'s own
// error.
func (p *Processor) apply(ctx context.Context, tx pgx.Tx, fresh []Message, isolate bool) (errs []error, err error) {
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
		if isRetryableTx(err) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", errIsolate, err)
	}
	return errs, nil
}

// decide turns the effects' errors into outcomes and lists the rows to
// mark rejected and the claims to release for a retry.
func (p *Processor) decide(b *batch, errs []error) (rejIDs, rejReasons, retryIDs []string) {
	msgs, out := b.msgs, b.out
	for j, i := range b.freshIdx {
		e := errs[j]
		switch {
		case e == nil:
			out[i] = Outcome{Status: StatusApplied}
		case IsPermanent(e):
			out[i] = Outcome{Status: StatusRejected, Reason: e.Error(), Err: e}
		case msgs[i].Final:
			reason := fmt.Sprintf("gave up after %d deliveries: %v", msgs[i].Deliveries, e)
			out[i] = Outcome{Status: StatusRejected, Reason: reason, Err: e}
		default:
			out[i] = Outcome{Status: StatusRetry, Reason: e.Error(), Err: e}
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
			o.Redelivered = false
			if o.FirstSeq == 0 && !b.refused[d[1]] {
				o.FirstSeq = msgs[d[1]].StreamSeq
			}
		case StatusConflict:
			o.Redelivered = false // each conflicting message is dead-lettered
		}
		out[d[0]] = o
	}
	return rejIDs, rejReasons, retryIDs
}

// commit commits under a context the caller cannot cancel, bounded by
// CommitTimeout, and tells a rollback from an unknown outcome.
func (p *Processor) commit(ctx context.Context, tx pgx.Tx, n int) error {
	endCommit := p.span(ctx, "jetinbox.commit", n)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.CommitTimeout)
	err := tx.Commit(cctx)
	cancel()
	endCommit(err)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback) {
			return fmt.Errorf("inbox: commit rolled back: %w", err)
		}
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	if p.fires(hook.AfterCommit) {
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, &hook.Crash{Point: hook.AfterCommit})
	}
	return nil
}

// span starts a child span when tracing and returns its end function.
func (p *Processor) span(ctx context.Context, name string, n int) func(error) {
	if p.tracer == nil {
		return func(error) {}
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
func (p *Processor) record(ctx context.Context, tx pgx.Tx, msgs []Message, rejIDs, rejReasons, retryIDs []string, conflicts []int) error {
	if len(rejIDs) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE inbox SET status = 'rejected', reason = t.reason
FROM unnest($2::text[], $3::text[]) AS t(id, reason)
WHERE inbox.scope = $1 AND inbox.message_id = t.id`, p.cfg.Scope, rejIDs, rejReasons); err != nil {
			return fmt.Errorf("inbox: record rejections: %w", err)
		}
	}
	if len(retryIDs) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM inbox WHERE scope = $1 AND message_id = ANY($2::text[])`,
			p.cfg.Scope, retryIDs); err != nil {
			return fmt.Errorf("inbox: release retried claims: %w", err)
		}
	}
	if len(conflicts) > 0 {
		// In ID order, like the claims: two processes recording the same
		// conflicts cannot deadlock.
		slices.SortFunc(conflicts, func(a, b int) int { return strings.Compare(msgs[a].ID, msgs[b].ID) })
		ids := make([]string, len(conflicts))
		fps := make([][]byte, len(conflicts))
		seqs := make([]int64, len(conflicts))
		subjects := make([]string, len(conflicts))
		for k, i := range conflicts {
			fp := Fingerprint(msgs[i].Payload)
			ids[k], fps[k], seqs[k], subjects[k] = msgs[i].ID, fp[:], int64(msgs[i].StreamSeq), msgs[i].Subject
		}
		if _, err := tx.Exec(ctx, `INSERT INTO inbox_conflicts (scope, message_id, fingerprint, stream_seq, subject)
SELECT $1, * FROM unnest($2::text[], $3::bytea[], $4::bigint[], $5::text[])
ON CONFLICT (scope, message_id, stream_seq) DO NOTHING`, p.cfg.Scope, ids, fps, seqs, subjects); err != nil {
			return fmt.Errorf("inbox: record conflicts: %w", err)
		}
	}
	return nil
}

// handle calls the handler, turning a panic into an error.
func (p *Processor) handle(ctx context.Context, tx pgx.Tx, msgs []Message, errs []error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = Permanent(fmt.Errorf("inbox: effect panicked: %v\n%s", r, debug.Stack()))
		}
	}()
	if p.fires(hook.EffectPanic) {
		panic("simulated panic at " + hook.EffectPanic.String())
	}
	return p.cfg.Handler.Handle(p.withScope(ctx), tx, msgs, errs)
}

type scopeKey struct{}

func (p *Processor) withScope(ctx context.Context) context.Context {
	return context.WithValue(ctx, scopeKey{}, p.cfg.Scope)
}

// ScopeFromContext returns the scope of the [Processor] whose handler got
// ctx, so that an effect can record which (scope, message ID) applied it.
func ScopeFromContext(ctx context.Context) (string, bool) {
	s, ok := ctx.Value(scopeKey{}).(string)
	return s, ok
}

// handleIsolated applies each message under its own savepoint: a message
// that fails is rolled back alone and reported in errs.
func (p *Processor) handleIsolated(ctx context.Context, tx pgx.Tx, msgs []Message, errs []error) error {
	one := make([]error, 1)
	for j := range msgs {
		if _, err := tx.Exec(ctx, "SAVEPOINT jetinbox_msg"); err != nil {
			return fmt.Errorf("inbox: savepoint: %w", err)
		}
		one[0] = nil
		err := p.handle(ctx, tx, msgs[j:j+1], one)
		if err == nil {
			err = one[0]
		}
		if err == nil {
			if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT jetinbox_msg"); err != nil {
				return fmt.Errorf("inbox: release savepoint: %w", err)
			}
			continue
		}
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT jetinbox_msg"); rerr != nil {
			return fmt.Errorf("inbox: rollback to savepoint: %w", rerr)
		}
		if _, rerr := tx.Exec(ctx, "RELEASE SAVEPOINT jetinbox_msg"); rerr != nil {
			return fmt.Errorf("inbox: release savepoint: %w", rerr)
		}
		if isRetryableTx(err) || isConnError(err) || ctx.Err() != nil {
			// Not this message's fault: retry the whole batch later.
			return err
		}
		if isDataError(err) && !IsPermanent(err) {
			err = Permanent(err)
		}
		errs[j] = err
	}
	return nil
}

// isRetryableTx reports deadlocks and serialization failures, which a retry
// of the same transaction resolves.
func isRetryableTx(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// isDataError reports errors that the same input will always cause: data
// exceptions (class 22) and integrity violations (class 23).
func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && len(pgErr.Code) == 5 && (pgErr.Code[:2] == "22" || pgErr.Code[:2] == "23")
}

// isConnError reports errors that say the connection or the server is gone,
// not that one message failed: connection exceptions (class 08), the
// server shutting down (57P01-57P05), network errors. A statement timeout
// (57014) is the message's own problem and is retried for that message.
func isConnError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code[:2] == "08" || strings.HasPrefix(pgErr.Code, "57P")
	}
	var netErr net.Error
	return pgconn.SafeToRetry(err) || errors.As(err, &netErr) || errors.Is(err, pgx.ErrTxClosed)
}
