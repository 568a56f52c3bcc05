// Calling the handler: panics become errors, isolation under savepoints,
// and which database errors are the message's fault.

package inbox

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/internal/hook"
)

// handle calls the handler, turning a panic into an error. The stack goes
// to the log; the error, which becomes the reason of the row and of the
// dead letter, carries the panic's value only.
func (p *Processor[TX]) handle(ctx context.Context, tx TX, msgs []Message, errs []error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			ids := make([]string, 0, min(len(msgs), 10))
			for _, m := range msgs[:min(len(msgs), 10)] {
				ids = append(ids, m.ID)
			}
			p.cfg.Logger.ErrorContext(ctx, "inbox: the effect panicked", "scope", p.cfg.Scope, "messages", len(msgs), "ids", ids,
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = Permanent(fmt.Errorf("%w: %v", errEffectPanicked, r))
		}
	}()
	if p.fires(hook.EffectPanic) {
		panic("simulated panic at " + hook.EffectPanic.String())
	}
	return p.handler.Handle(p.withScope(ctx), tx, msgs, errs)
}

type scopeKey struct{}

func (p *Processor[TX]) withScope(ctx context.Context) context.Context {
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
func (p *Processor[TX]) handleIsolated(ctx context.Context, tx TX, msgs []Message, errs []error) error {
	one := make([]error, 1)
	for j := range msgs {
		if err := p.store.Savepoint(ctx, tx, "SAVEPOINT jetinbox_msg"); err != nil {
			return fmt.Errorf("inbox: savepoint: %w", err)
		}
		one[0] = nil
		err := p.handle(ctx, tx, msgs[j:j+1], one)
		if err == nil {
			err = one[0]
		}
		if err == nil {
			if err := p.store.Savepoint(ctx, tx, "RELEASE SAVEPOINT jetinbox_msg"); err != nil {
				return fmt.Errorf("inbox: release savepoint: %w", err)
			}
			continue
		}
		if rerr := p.store.Savepoint(ctx, tx, "ROLLBACK TO SAVEPOINT jetinbox_msg"); rerr != nil {
			return fmt.Errorf("inbox: rollback to savepoint: %w", rerr)
		}
		if rerr := p.store.Savepoint(ctx, tx, "RELEASE SAVEPOINT jetinbox_msg"); rerr != nil {
			return fmt.Errorf("inbox: release savepoint: %w", rerr)
		}
		kind := p.store.Classify(err)
		if kind == driver.ErrorRetryTx || kind == driver.ErrorConn || ctx.Err() != nil {
			// Not this message's fault: retry the whole batch later.
			return err
		}
		if kind == driver.ErrorData && !IsPermanent(err) {
			err = Permanent(err)
		}
		errs[j] = err
	}
	return nil
}
