package app

import (
	"flag"
	"fmt"
	"io"
	"time"
)

// flagSet is the subset of *flag.FlagSet the shared registrations use.
type flagSet interface {
	StringVar(p *string, name, value, usage string)
	IntVar(p *int, name string, value int, usage string)
	DurationVar(p *time.Duration, name string, value time.Duration, usage string)
	BoolVar(p *bool, name string, value bool, usage string)
	Var(value flag.Value, name, usage string)
}

// newFlagSet returns a flag set that reports errors instead of exiting and
// prints its usage with every flag's default.
func newFlagSet(name, summary string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n\nUsage of %s:\n", summary, name)
		fs.PrintDefaults()
	}
	return fs
}

// envDuration reads a duration from the environment for a flag default; a
// value that does not parse is reported through errs.
func envDuration(env Env, name string, def time.Duration, errs *[]error) time.Duration {
	v := env(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s=%q: %w", name, v, err))
		return def
	}
	return d
}
