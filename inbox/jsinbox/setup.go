package jsinbox

import (
	"errors"
	"fmt"

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
