// Package jittersim is the experiment behind package jitter. First a retry storm: clients that
// all fail at the same instant and retry, every retry failing again, so that only where the
// retries land is measured, under each jitter formula and cenkalti/backoff's own randomization.
// It draws from a mulberry32 generator, so its table is the same on every machine and every
// run (TestStormTable pins it). Then an overloaded server that shows what the delays cost when
// failed retries retry again. Its results chose jitter.Default. Main is the `jitter` command.
// docs/design.md says where retry timing sits in the design.
package jittersim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/jitter"
)

// Config holds the simulation parameters; DefaultConfig returns the ones the table in docs/operations.md
// was computed with.
type Config struct {
	Clients  int           // clients that fail at the same instant
	Base     time.Duration // base delay
	Cap      time.Duration // largest delay
	Attempts int           // retries per client in the retry storm
	Bucket   time.Duration // width of a counting bucket (and, overloaded, of a capacity slot)
	Seed     uint32        // mulberry32 seed

	Capacity         int // overloaded: requests the server serves per bucket
	OverloadAttempts int // overloaded: retries a client makes before it gives up
}

// DefaultConfig returns the retry storm's parameters (1000 clients, base 100 ms, cap 10 s, 5
// retries, 10 ms buckets, seed 42) and, for the overloaded server, 50 requests per bucket and 50
// retries.
func DefaultConfig() Config {
	return Config{
		Clients: 1000, Base: 100 * time.Millisecond, Cap: 10 * time.Second, Attempts: 5,
		Bucket: 10 * time.Millisecond, Seed: 42, Capacity: 50, OverloadAttempts: 50,
	}
}

func (c Config) validate() error {
	var errs []error
	if c.Clients <= 0 {
		errs = append(errs, fmt.Errorf("-clients %d: must be positive", c.Clients))
	}
	if c.Base <= 0 {
		errs = append(errs, fmt.Errorf("-base %v: must be positive", c.Base))
	}
	if c.Cap < c.Base {
		errs = append(errs, fmt.Errorf("-cap %v: must be at least -base %v", c.Cap, c.Base))
	}
	if c.Attempts <= 0 {
		errs = append(errs, fmt.Errorf("-attempts %d: must be positive", c.Attempts))
	}
	if c.Bucket <= 0 {
		errs = append(errs, fmt.Errorf("-bucket %v: must be positive", c.Bucket))
	}
	if c.Capacity <= 0 {
		errs = append(errs, fmt.Errorf("-capacity %d: must be positive", c.Capacity))
	}
	if c.OverloadAttempts <= 0 {
		errs = append(errs, fmt.Errorf("-overload-attempts %d: must be positive", c.OverloadAttempts))
	}
	return errors.Join(errs...)
}

// Main runs the `jitter` command: it parses args (without the command name) and prints the
// storm table and the overloaded-server table to stdout. It writes a chart only when -chart
// names a file: nothing lands in the working directory unasked. With -h it prints the usage to
// stderr and returns flag.ErrHelp.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := DefaultConfig()
	var seed uint64
	var chart string
	fs := flag.NewFlagSet("jitter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: jitter [flags]\n\n"+
			"Simulates clients that all fail at once and retry with no, full, equal and decorrelated\n"+
			"jitter (and cenkalti/backoff's own randomization): first a retry storm (every retry\n"+
			"fails; where do they land?), then a server that serves -capacity requests per bucket.\n\n")
		fs.PrintDefaults()
	}
	fs.IntVar(&c.Clients, "clients", c.Clients, "clients that fail at the same instant")
	fs.DurationVar(&c.Base, "base", c.Base, "base delay")
	fs.DurationVar(&c.Cap, "cap", c.Cap, "largest delay")
	fs.IntVar(&c.Attempts, "attempts", c.Attempts, "retries per client in the retry storm")
	fs.DurationVar(&c.Bucket, "bucket", c.Bucket, "width of a counting bucket")
	fs.Uint64Var(&seed, "seed", uint64(c.Seed), "mulberry32 seed (taken modulo 2^32)")
	fs.IntVar(&c.Capacity, "capacity", c.Capacity, "overloaded server: requests served per bucket")
	fs.IntVar(&c.OverloadAttempts, "overload-attempts", c.OverloadAttempts, "overloaded server: retries before a client gives up")
	fs.StringVar(&chart, "chart", chart, "also write a chart to this file, SVG (or PNG for a .png name); default: no chart")
	if err := fs.Parse(args); err != nil {
		return err // flag.ErrHelp for -h; the flag package printed the problem and the usage
	}
	if fs.NArg() > 0 {
		return cli.UsageError{Err: fmt.Errorf("jitter: unexpected arguments %q", fs.Args())}
	}
	c.Seed = uint32(seed & math.MaxUint32)
	if err := c.validate(); err != nil {
		return cli.UsageError{Err: fmt.Errorf("jitter: %w", err)}
	}

	rows := Storm(c)
	if err := ctx.Err(); err != nil {
		return err
	}
	results := Overload(c)
	if err := ctx.Err(); err != nil {
		return err
	}

	bucket := ms(c.Bucket)
	for _, r := range rows {
		fmt.Fprintf(stdout, "%-13s peak retries in one %g ms bucket: %4d   (total %d)", r.Name, bucket, r.Peak, r.Total)
		if r.Varies {
			fmt.Fprint(stdout, "   varies per run: math/rand's global source, which no seed controls")
		}
		fmt.Fprintln(stdout)
	}
	fmt.Fprintf(stdout, "\noverloaded server: %d clients fail at 0 s, then at most %d requests are served per %g ms; "+
		"a request beyond that fails and retries (at most %d retries)\n",
		c.Clients, c.Capacity, bucket, c.OverloadAttempts)
	fmt.Fprintf(stdout, "%-13s %9s %9s %9s %9s %6s %7s\n", "policy", "all done", "p99", "median", "requests", "peak", "gave up")
	for _, r := range results {
		fmt.Fprintf(stdout, "%-13s %8.2fs %8.2fs %8.2fs %9d %6d %7d", r.Name, r.Done.Seconds(), r.P99.Seconds(), r.Median.Seconds(), r.Requests, r.Peak, r.Failed)
		if r.Varies {
			fmt.Fprint(stdout, "   varies per run")
		}
		fmt.Fprintln(stdout)
	}
	fmt.Fprintf(stdout, "ranking (fewest requests sent, then lowest peak): %s; jitter.Default uses %s\n",
		strings.Join(Rank(results), " < "), jitter.Default().Kind)
	if chart != "" {
		if err := WriteChart(chart, c, rows, results); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\nchart: %s\n", chart)
	}
	return nil
}
