package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/internal/hook"
	"github.com/jetinbox/jetinbox/jitter"
)

// Handler applies the side effects of freshly claimed messages inside the
// inbox transaction, a TX of the processor's store: pgx.Tx for
// PostgreSQL (package pginbox), *sql.Tx for SQLite (package sqliteinbox).
// [HandlerFunc] makes one from a function that applies one message.
//
// Handle gets every fresh message of a batch and sets errs[i] (len(errs) ==
// len(msgs)) for each message it did not apply; an error wrapped with
// [Permanent] rejects that message, any other error retries it later. For a
// message with errs[i] set, Handle must have written nothing, and the
// transaction must still be usable: validate before writing. The msgs
// slice is the processor's, reused for later batches: Handle may keep the
// messages it copies out of it, not the slice.
//
// A non-nil return value means the batch as a whole failed (for example a
// statement aborted the transaction). The processor then rolls back and
// applies the batch one message at a time, each under a savepoint, so that
// one poison message cannot take its neighbours down. Deadlocks and
// serialization failures retry the whole batch instead.
type Handler[TX any] interface {
	Handle(ctx context.Context, tx TX, msgs []Message, errs []error) error
}

// HandlerFunc makes a [Handler] of a function that applies one message;
// TX is inferred from the function's transaction parameter. It is the
// simple way in; a set-based handler is faster for big batches.
func HandlerFunc[TX any](f func(ctx context.Context, tx TX, msg Message) error) Handler[TX] {
	return handlerFunc[TX](f)
}

type handlerFunc[TX any] func(ctx context.Context, tx TX, msg Message) error

// Handle implements [Handler]. The first error fails the batch, since a
// failed statement may have aborted the transaction; the processor then
// applies the messages one at a time under savepoints and reports each
// message's own error.
func (f handlerFunc[TX]) Handle(ctx context.Context, tx TX, msgs []Message, errs []error) error {
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

// Config configures a [Processor]. The zero value of every field but Scope
// is a documented default.
type Config struct {
	// Scope names the effect: the inbox key is (Scope, message ID), so an
	// ID is applied at most once per scope, and two effects with different
	// scopes each apply a message once. It is the identity of the effect,
	// not of the subscription: keep it when a durable is renamed or
	// re-created, or the stream is applied again. Handlers read it with
	// [ScopeFromContext]. Required.
	Scope string
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
	// effects at once. Claims always overlap; the effect step takes a
	// turn, held from the end of the claim to the start of the COMMIT, so
	// the next batch's effect runs while this one commits. Effects that
	// update shared rows (balances, counters) serialize on row locks
	// anyway; taking turns in-process keeps them from piling up in lock
	// waits inside PostgreSQL, where a batch waiting for another holds its
	// own rows and stalls a third. A batch whose effect meets a row the
	// committing batch changed waits for that COMMIT in the database; a
	// COMMIT takes no row lock (unless deferred constraints check rows:
	// a deadlock there is one PostgreSQL breaks, and the batch it rolls
	// back is tried again). Default 1; raise it for effects that touch
	// disjoint rows.
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
	if err := c.TxRetry.Validate(); err != nil {
		return fmt.Errorf("inbox: config: TxRetry: %w", err)
	}
	return nil
}

// Processor claims and applies batches of messages, one transaction of
// its store per batch. It is safe for concurrent use; each call uses its
// own transaction.
type Processor[TX any] struct {
	store   driver.Store[TX]
	handler Handler[TX]
	cfg     Config
	tracer  trace.Tracer  // nil unless tracing
	turns   chan struct{} // effect turns, EffectConcurrency of them
	// copyCooldown counts down the batches still to claim with conflict
	// checks after a copy claim met an existing row.
	copyCooldown  atomic.Int32
	copyClaims    atomic.Int64
	copyFallbacks atomic.Int64

	// hook, nil unless a harness attached one (internal/hook), stops the
	// processor at named points.
	hook hook.Func
}

func init() {
	hook.Register(func(target any, f hook.Func) bool {
		p, ok := target.(interface{ setHook(hook.Func) })
		if ok {
			p.setHook(f)
		}
		return ok
	})
}

func (p *Processor[TX]) setHook(f hook.Func) { p.hook = f }

// fires reports whether the harness's hook stops the processor at pt.
func (p *Processor[TX]) fires(pt hook.Point) bool { return p.hook != nil && p.hook(pt) }

// ProcessorStats counts how batches were claimed.
type ProcessorStats struct {
	// CopyClaims: batches claimed on the store's fast path (on PostgreSQL
	// with COPY: first deliveries, 64+ messages).
	CopyClaims int64
	// CopyFallbacks: batches whose COPY met an ID already claimed and that
	// were claimed again with conflict checks. A steady rate means first
	// deliveries of old IDs: a replay, or copies published after the
	// stream's duplicate window.
	CopyFallbacks int64
}

// Stats returns the counters so far.
func (p *Processor[TX]) Stats() ProcessorStats {
	return ProcessorStats{CopyClaims: p.copyClaims.Load(), CopyFallbacks: p.copyFallbacks.Load()}
}

// NewProcessor returns a processor keeping its inbox in store (a
// pginbox.Store or a sqliteinbox.Store) and applying effects with handler,
// in the store's transactions; TX is inferred from both.
func NewProcessor[TX any](store driver.Store[TX], handler Handler[TX], cfg Config) (*Processor[TX], error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if isNil(store) {
		return nil, errors.New("inbox: NewProcessor: store is nil")
	}
	if isNil(handler) {
		return nil, errors.New("inbox: NewProcessor: handler is nil")
	}
	p := &Processor[TX]{store: store, handler: handler, cfg: cfg, turns: make(chan struct{}, cfg.EffectConcurrency)}
	if cfg.TracerProvider != nil {
		p.tracer = cfg.TracerProvider.Tracer("github.com/jetinbox/jetinbox/inbox")
	}
	return p, nil
}

// Warmer is implemented by handlers that can prepare for their first
// batch (prepare statements, load caches) on a fresh connection. See
// [Processor.Warm]; on PostgreSQL it is called only on connections that
// cache prepared statements (pgx's default mode), so it may prepare them.
type Warmer[TX any] interface {
	Warm(ctx context.Context, tx TX) error
}

// Warm opens n transactions at once, so that a pool opens n connections,
// prepares the claim statements (and the handler's, if it is a [Warmer])
// on each, and rolls them back. Run it before the first batch: a cold start
// otherwise puts connection setup and statement preparation into the
// latency of the first messages. n is capped at a pool's MaxConns, and is 1
// for a single connection or a store with one writer (SQLite). Statements
// are prepared only where the connection caches them anyway (pgx's default
// mode; not with a transaction-pooling proxy set up for exec or
// simple-protocol mode). Warm gives up after 10 seconds.
func (p *Processor[TX]) Warm(ctx context.Context, n int) error {
	return p.store.Warm(ctx, n, func(ctx context.Context, tx TX) error {
		if w, ok := p.handler.(Warmer[TX]); ok {
			if err := w.Warm(ctx, tx); err != nil {
				return fmt.Errorf("inbox: warm handler: %w", err)
			}
		}
		return nil
	})
}

// Ping checks that the store's database answers.
func (p *Processor[TX]) Ping(ctx context.Context) error { return p.store.Ping(ctx) }

// Check runs the store's check transaction (see the store's Check): it fails
// where a batch would fail for the database's or the deployment's reason,
// with [ErrNotMigrated] or [ErrDatabaseUnfit] when the database answers but
// cannot take batches as it is set up. A consumer checks at start, and
// while a batch failed for such a reason it pauses until Check passes, so
// that an outage, a read-only node or a missing migration does not turn
// into a redelivery storm.
func (p *Processor[TX]) Check(ctx context.Context) error { return p.store.Check(ctx) }

// Logger returns the processor's logger ([Config.Logger]); a transport
// logs through it too.
func (p *Processor[TX]) Logger() *slog.Logger { return p.cfg.Logger }

// TracerProvider returns [Config.TracerProvider], nil when not tracing; a
// transport traces its own steps with it.
func (p *Processor[TX]) TracerProvider() trace.TracerProvider { return p.cfg.TracerProvider }

// Scope returns the processor's scope.
// StoreName names the processor's store by its type, as
// "pginbox.Store" or "sqliteinbox.Store": the consumer's start-up line
// shows it.
func (p *Processor[TX]) StoreName() string {
	return strings.TrimPrefix(fmt.Sprintf("%T", p.store), "*")
}

func (p *Processor[TX]) Scope() string { return p.cfg.Scope }

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
func (p *Processor[TX]) Process(ctx context.Context, msgs []Message) ([]Outcome, error) {
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
		if fast && errors.Is(err, driver.ErrClaimedBefore) {
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
		if p.store.Classify(err) == driver.ErrorRetryTx && ctx.Err() == nil {
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
		notMine := p.notMessageFault(err)
		for _, i := range valid {
			out[i] = Outcome{Status: StatusRetry, Cause: CauseBatchFailed, Reason: SanitizeReason(err.Error()), Err: err, NotMessageFault: notMine}
		}
		return out, err
	}
}

// notMessageFault reports whether a batch failed for a reason that is no
// message's: the database or the deployment (a store's connection-kind error), contention
// that outlasted the retries, or a commit whose outcome is unknown.
func (p *Processor[TX]) notMessageFault(err error) bool {
	if errors.Is(err, ErrOutcomeUnknown) {
		return true
	}
	k := p.store.Classify(err)
	return k == driver.ErrorConn || k == driver.ErrorRetryTx
}

// copyCooldownBatches is how many batches after a failed copy claim are
// claimed with conflict checks before COPY is tried again.
const copyCooldownBatches = 32

// copyClaimable reports whether a batch may be claimed with COPY: it is big
// enough for COPY to pay, every message is on its first delivery (a
// redelivery may well be claimed already), and no recent copy claim hit an
// existing row. Everything else takes the store's Claim. COPY is an optimisation
// only: when it meets a claimed ID the transaction is rolled back and the
// batch claimed again with ClaimTx, so both paths give the same outcomes.
func (p *Processor[TX]) copyClaimable(msgs []Message, valid []int) bool {
	if t := p.store.ClaimNewThreshold(); t <= 0 || len(valid) < t {
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

// isNil reports whether v is nil or a nil pointer, map, func or chan held
// in an interface.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return r.IsNil()
	}
	return false
}
