// Calling the handler: panics become errors, isolation under savepoints,
// and which database errors are the message's fault.

package inbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/internal/hook"
)

// handle calls the handler, turning a panic into an error. The stack goes
// to the log; the error, which becomes the reason of the row and of the
// dead letter, carries the panic's value only.
func (p *ProcessorOf[TX]) handle(ctx context.Context, tx TX, msgs []Message, errs []error) (err error) {
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
	return p.cfg.Handler.Handle(p.withScope(ctx), tx, msgs, errs)
}

type scopeKey struct{}

func (p *ProcessorOf[TX]) withScope(ctx context.Context) context.Context {
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
func (p *ProcessorOf[TX]) handleIsolated(ctx context.Context, tx TX, msgs []Message, errs []error) error {
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
		if kind == ErrorRetryTx || kind == ErrorConn || ctx.Err() != nil {
			// Not this message's fault: retry the whole batch later.
			return err
		}
		if kind == ErrorData && !IsPermanent(err) {
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
// server shutting down (57P01-57P05), network errors, and a write refused
// by a read-only node (25006): after a failover the old primary is a
// standby, and the connection, not the message, points at the wrong node.
// A statement timeout (57014) is the message's own problem and is retried
// for that message.
func isConnError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code[:2] == "08" || strings.HasPrefix(pgErr.Code, "57P") || pgErr.Code == "25006"
	}
	var netErr net.Error
	return pgconn.SafeToRetry(err) || errors.As(err, &netErr) || errors.Is(err, pgx.ErrTxClosed)
}
