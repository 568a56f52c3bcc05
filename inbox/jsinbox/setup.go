package jsinbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// SetupError reports a stream or durable the server does not have, refuses
// to create, or has with unsafe settings: a retry cannot help until an
// operator changes the servers' configuration. Commands exit 2 on it.
type SetupError struct{ Err error }

// Error returns the wrapped error's message.
func (e *SetupError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *SetupError) Unwrap() error { return e.Err }

// setupError marks err as a SetupError when the server answered with a
// refusal (not found, an API error, a permission denied), and returns it
// unchanged when it is a transport failure worth retrying.
func setupError(err error) error {
	var api *jetstream.APIError
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrPermissionViolation) || errors.As(err, &api) {
		return &SetupError{Err: err}
	}
	return err
}

// streamNotFound says how to create a missing intents stream: the library
// call first, the command line second.
func streamNotFound(stream string, err error) error {
	return &SetupError{Err: fmt.Errorf("jsinbox: stream %s not found: create it with jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{Name: %q}) "+
		"(`jetinbox producer` calls it), or with nats stream add %s --config deploy/jetstream/intents-stream.json: %w", stream, stream, stream, err)}
}

// isNoResponders reports whether err says that nothing answered a
// publish: no stream captures its subject, or JetStream is not enabled.
func isNoResponders(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// apiTimeout bounds each JetStream API request the consumer makes by
// itself (binding its durables, the size checks, the rescue's reads).
// nats.go applies its own default timeout only to a context that has no
// deadline; Run's context may have one hours away (a job's), and a request
// whose reply is lost, as one can be while a stream or consumer leader is
// being elected, would then hold the consumer until that deadline.
const apiTimeout = 5 * time.Second

// apiCtx is ctx bounded for one JetStream API request.
func apiCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, apiTimeout)
}

// jsClusterUnavailable is the server's "JetStream system temporarily
// unavailable": no meta or stream leader yet.
const jsClusterUnavailable jetstream.ErrorCode = 10008

// transient reports whether a failed set-up request is worth trying again
// as it is: no answer in time, a connection being re-established, or the
// cluster electing a leader. A refusal is not (nor is "no responders", a
// server without JetStream), and neither is a connection closed for good.
func transient(err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.ErrorCode == jsClusterUnavailable
	}
	var se *SetupError
	if errors.As(err, &se) {
		return false
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, jetstream.ErrNoHeartbeat)
}

// setUp runs step until it succeeds, fails for a reason a retry cannot
// change, or ctx ends; a transient failure (see [transient]) is tried again
// after a jittered wait from the DBWait policy, so that a consumer started
// while a leader is being elected waits it out instead of exiting.
func (c *Consumer) setUp(ctx context.Context, step func() error) error {
	bo := c.cfg.DBWait.NewBackOff()
	for {
		err := step()
		if err == nil || !transient(err) || ctx.Err() != nil || ClosedForGood(c.js.Conn()) != nil {
			return err
		}
		// A request the account may not send is dropped by the server
		// with only an asynchronous "permissions violation": it looks
		// like no answer, and waiting cannot change it.
		if le := c.js.Conn().LastError(); errors.Is(le, nats.ErrPermissionViolation) {
			return fmt.Errorf("%w (the connection's last error: %v)", err, le)
		}
		d := bo.NextBackOff()
		if d < 0 {
			return err
		}
		c.cfg.Logger.Warn("jsinbox: setting up the durable got no answer; retrying", "durable", c.cfg.Durable, "err", err, "in", d)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(d):
		}
	}
}

// withAPI runs one JetStream API request under [apiCtx].
func withAPI[T any](ctx context.Context, req func(context.Context) (T, error)) (T, error) {
	actx, cancel := apiCtx(ctx)
	defer cancel()
	return req(actx)
}

// stream is js.Stream under [apiCtx].
func (c *Consumer) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	return withAPI(ctx, func(ctx context.Context) (jetstream.Stream, error) { return c.js.Stream(ctx, name) })
}
