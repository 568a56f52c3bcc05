package cli

import (
	"errors"
	"flag"
	"fmt"
	"github.com/jackc/pgx/v5"
	"io"
	"strconv"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
)

// FlagSet is the subset of *flag.FlagSet the shared registrations use.
type FlagSet interface {
	StringVar(p *string, name, value, usage string)
	IntVar(p *int, name string, value int, usage string)
	DurationVar(p *time.Duration, name string, value time.Duration, usage string)
	BoolVar(p *bool, name string, value bool, usage string)
	Var(value flag.Value, name, usage string)
}

// NewFlagSet returns a flag set that reports errors instead of exiting and
// prints its usage with every flag's default.
func NewFlagSet(name, summary string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n\nUsage of %s:\n", summary, name)
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\n%s\n", ExitCodes)
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

// envInt64 reads an integer from the environment for a flag default; a
// value that does not parse is reported through errs.
func envInt64(env Env, name string, errs *[]error) int64 {
	v := env(name)
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s=%q: %w", name, v, err))
	}
	return n
}

// defaultScope is the inbox scope every command uses unless told otherwise.
// It is the effect's identity, not the subscription's: the default matches
// the durable's default name, which was also the scope before the two were
// separate settings, so existing inbox rows keep counting.
const defaultScope = effects.DefaultScope

// scopeUsage is the help text of -scope, the same in every command.
const scopeUsage = "inbox scope: the identity of the effect; each message ID is applied at most once per scope. " +
	"Never change it for a running pipeline: under a new scope every message in the stream is applied again (env JETINBOX_SCOPE)"

// durableUsage is the help text of -durable for commands that read the
// durable's settings or pending counts.
const durableUsage = "JetStream durable consumer: only the subscription, not the effect's identity; " +
	"renaming or re-creating it redelivers the stream, which the inbox absorbs as duplicates (env JETINBOX_DURABLE)"

// DatabaseUsage is the help text of -database-url.
const DatabaseUsage = "database: a PostgreSQL connection string, or a SQLite file as sqlite:///path/to/file.db (env DATABASE_URL)"

// DatabaseFlag registers -database-url, and -store as another name for it,
// defaulting to DATABASE_URL, with usage as its help text: DatabaseUsage,
// or a longer one.
func DatabaseFlag(fs FlagSet, env Env, usage string) *string {
	s := new(string)
	fs.StringVar(s, "database-url", env("DATABASE_URL"), usage)
	fs.StringVar(s, "store", env("DATABASE_URL"), "the same as -database-url")
	return s
}

// RequireDatabase reports a missing -database-url as a usage error.
func RequireDatabase(dbURL string) error {
	if dbURL == "" {
		return UsageError{Err: errors.New("no database: set -database-url or DATABASE_URL")}
	}
	return nil
}

// StreamUsage is the help text of -stream.
const StreamUsage = "intents stream (env JETINBOX_STREAM)"

// StreamFlag registers -stream, defaulting to JETINBOX_STREAM or
// jsinbox.DefaultStream, with usage as its help text: StreamUsage, or one
// that says more.
func StreamFlag(fs FlagSet, env Env, usage string) *string {
	s := new(string)
	fs.StringVar(s, "stream", env.Or("JETINBOX_STREAM", jsinbox.DefaultStream), usage)
	return s
}

// ScopeFlag registers -scope, defaulting to JETINBOX_SCOPE or "ledger".
func ScopeFlag(fs FlagSet, env Env) *string {
	s := new(string)
	fs.StringVar(s, "scope", env.Or("JETINBOX_SCOPE", defaultScope), scopeUsage)
	return s
}

// DurableFlag registers -durable, defaulting to JETINBOX_DURABLE or "ledger".
func DurableFlag(fs FlagSet, env Env) *string {
	s := new(string)
	fs.StringVar(s, "durable", env.Or("JETINBOX_DURABLE", "ledger"), durableUsage)
	return s
}

// CheckScope reports an unusable scope as a usage error.
func CheckScope(scope string) error {
	if err := inbox.ValidateID(scope); err != nil {
		return UsageError{Err: fmt.Errorf("-scope / JETINBOX_SCOPE %q: %w", scope, err)}
	}
	return nil
}

// NewLedgerProcessor returns a processor whose inbox scope and ledger scope
// are one and the same, cfg.Scope: the two must never differ.
func NewLedgerProcessor(db pginbox.DB, cfg inbox.Config) (*inbox.Processor[pgx.Tx], error) {
	l, err := effects.NewScopedLedger(cfg.Scope)
	if err != nil {
		return nil, err
	}
	return inbox.NewProcessor(pginbox.New(db), l, cfg)
}
