package cli

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// checks collects the settings out of range, to report them all at once
// as one usage error.
type checks []error

// atLeast requires an integer flag to be min or more.
func (c *checks) atLeast(flag string, v, min int) {
	if v < min {
		*c = append(*c, fmt.Errorf("-%s %d: must be at least %d", flag, v, min))
	}
}

// within requires an integer flag within [lo, hi].
func (c *checks) within(flag string, v, lo, hi int) {
	if v < lo || v > hi {
		*c = append(*c, fmt.Errorf("-%s %d: must be within [%d, %d]", flag, v, lo, hi))
	}
}

// positive requires a duration flag above zero.
func (c *checks) positive(flag string, d time.Duration) {
	if d <= 0 {
		*c = append(*c, fmt.Errorf("-%s %v: must be positive", flag, d))
	}
}

// add records err, if any.
func (c *checks) add(err error) {
	if err != nil {
		*c = append(*c, err)
	}
}

// err returns the problems found as one UsageError, or nil.
func (c checks) err() error {
	if len(c) == 0 {
		return nil
	}
	return UsageError{Err: errors.Join(c...)}
}

// CheckLogFormat accepts the log formats NewLogger knows.
func CheckLogFormat(format string) error {
	switch format {
	case "json", "text", "auto", "":
		return nil
	}
	return fmt.Errorf("-log-format / JETINBOX_LOG_FORMAT %q: want json, text or auto", format)
}

// CheckListenAddr accepts host:port (host optional, port 0-65535) or empty.
func CheckListenAddr(flag, addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-%s %q: want host:port or :port: %w", flag, addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("-%s %q: port %q is not a number within [0, 65535]", flag, addr, port)
	}
	return nil
}
