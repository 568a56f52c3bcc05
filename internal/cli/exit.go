package cli

import (
	"errors"
	"flag"
)

// UsageError marks errors in flags or environment: exit code 2.
type UsageError struct{ Err error }

// Error returns the wrapped error's message.
func (u UsageError) Error() string { return u.Err.Error() }

// Unwrap returns the wrapped error.
func (u UsageError) Unwrap() error { return u.Err }

// ExitCode maps a command's error to a process exit code: 0 success, 2 for
// usage and configuration errors (and -h), 1 otherwise.
func ExitCode(err error) int {
	var u UsageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &u):
		return 2
	}
	return 1
}
