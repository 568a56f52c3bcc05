package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	// Scope names the effect: the inbox key is (Scope, message ID), so an
	// ID is applied at most once per scope, and two effects with different
	// scopes each apply a message once. It is the identity of the effect,
	// not of the subscription: keep it when a durable is renamed or
	// re-created, or the stream is applied again. Handlers read it with
	// [ScopeFromContext]. Required.
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
			out[i] = Outcome{Status: StatusRejected, Cause: rejectCause(err), Reason: SanitizeReason(err.Error()), Err: Permanent(err)}
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
			out[i] = Outcome{Status: StatusRetry, Cause: CauseBatchFailed, Reason: SanitizeReason(err.Error()), Err: err}
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
