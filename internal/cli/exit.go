package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/outbox"
)

// ExitCodes is the exit-code convention of every command (consumer,
// producer and each jetinbox subcommand); every usage text ends with it.
const ExitCodes = "Exit status: 0 ok; 1 failure (verify: violations found); " +
	"2 usage or configuration error (unknown flag, bad value, bad URL or address, missing stream, refused durable)."

// UsageError marks errors in flags, environment or the servers'
// configuration that the operator must fix before a retry can help: exit
// code 2.
type UsageError struct{ Err error }

// Error returns the wrapped error's message.
func (u UsageError) Error() string { return u.Err.Error() }

// Unwrap returns the wrapped error.
func (u UsageError) Unwrap() error { return u.Err }

// Parse parses args with fs and reports a parse error (unknown flag, bad
// value, missing argument) as a UsageError; -h stays flag.ErrHelp.
func Parse(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return UsageError{Err: err}
}

// flagErrorPrefixes are how the standard flag package words its parse
// errors, for the commands whose flag sets are parsed outside this package.
var flagErrorPrefixes = []string{
	"flag provided but not defined: ",
	"invalid value ",
	"invalid boolean value ",
	"invalid boolean flag ",
	"bad flag syntax: ",
	"flag needs an argument: ",
}

// IsFlagError reports whether err is, or wraps, a parse error of the
// standard flag package.
func IsFlagError(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		for _, p := range flagErrorPrefixes {
			if strings.HasPrefix(err.Error(), p) {
				return true
			}
		}
	}
	return false
}

// ExitCode maps a command's error to a process exit code: 0 success and
// -h, 2 usage and configuration errors (a UsageError, a flag parse error,
// or a server refusing what the operator configured: see IsConfigError),
// 1 otherwise.
func ExitCode(err error) int {
	var u UsageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &u), IsFlagError(err), IsConfigError(err):
		return 2
	}
	return 1
}

// configSQLStates are PostgreSQL's answers that no retry can change: the
// operator must fix a password, a database name, a grant or a migration.
var configSQLStates = map[string]bool{
	"28000": true, // invalid_authorization_specification (pg_hba.conf refused)
	"28P01": true, // invalid_password
	"3D000": true, // invalid_catalog_name: no such database
	"3F000": true, // invalid_schema_name
	"42501": true, // insufficient_privilege: a missing grant
	"42P01": true, // undefined_table: the schema is not migrated
}

// IsConfigError reports whether err, or an error it wraps, is the servers
// refusing the configuration a command was given: a stream or durable that
// does not exist or is unsafe (jsinbox.SetupError), a NATS permission or
// authorization refusal, a PostgreSQL login, database, grant or schema
// error, a database that cannot take writes as it is set up (read-only,
// behind a pooler in statement mode: inbox.ErrDatabaseUnfit), or a SQLite
// file that cannot be opened as given. Such errors exit
// 2 in every command, like a bad flag: retrying cannot help until an
// operator changes something.
func IsConfigError(err error) bool {
	var setup *jsinbox.SetupError
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return false
	case errors.As(err, &setup),
		errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, jetstream.ErrConsumerNotFound),
		errors.Is(err, nats.ErrPermissionViolation),
		errors.Is(err, nats.ErrAuthorization),
		errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked),
		errors.Is(err, inbox.ErrNotMigrated),
		errors.Is(err, inbox.ErrDatabaseUnfit),
		errors.Is(err, outbox.ErrNotMigrated),
		missingTable(err):
		return true
	case errors.As(err, &pgErr):
		return configSQLStates[pgErr.Code]
	case sqliteinbox.IsConfigError(err):
		return true
	}
	return false
}

// missingTable reports whether err is a database saying a table the
// command reads does not exist: PostgreSQL's undefined_table, SQLite's
// "no such table".
func missingTable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "42P01"
	}
	return strings.Contains(err.Error(), "no such table")
}

// MigrateHint adds what to do to an error that says the database has no
// jetinbox tables (undefined_table on PostgreSQL, "no such table" on
// SQLite): run migrate against the same database. Other errors, and
// errors that already say it (inbox.ErrNotMigrated), are returned as
// they are.
func MigrateHint(err error) error {
	if err == nil || errors.Is(err, inbox.ErrNotMigrated) || errors.Is(err, outbox.ErrNotMigrated) || !missingTable(err) {
		return err
	}
	return fmt.Errorf("%w (the database lacks jetinbox tables: run `jetinbox migrate` with this DATABASE_URL)", err)
}

// ReportError writes a command's final error to stderr, once: a JSON log
// line when the command logs JSON (-log-format in args, else
// JETINBOX_LOG_FORMAT, else def; auto is JSON unless stderr is a
// terminal), else "name: message". Nothing for nil or -h. A prefix the
// message already has is not repeated ("consumer: consumer: ...").
func ReportError(stderr io.Writer, name string, args []string, env Env, def string, err error) {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return
	}
	msg := dedupPrefixes(strings.TrimPrefix(err.Error(), name+": "))
	format := logFormatArg(args)
	if format == "" {
		format = env.Or("JETINBOX_LOG_FORMAT", def)
	}
	if logFormat(stderr, format) == "json" {
		NewLogger(stderr, "json", slog.LevelError).Error(name+": exiting", "err", msg, "exit_code", ExitCode(err))
		return
	}
	fmt.Fprintf(stderr, "%s: %s\n", name, msg)
}

// logFormatArg finds -log-format (or --log-format) in args, as the flag
// package would parse it; "" if absent.
func logFormatArg(args []string) string {
	for i, a := range args {
		if a == "--" {
			break
		}
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if v, ok := strings.CutPrefix(a, "log-format="); ok {
			return v
		}
		if a == "log-format" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// dedupPrefixes collapses a repeated "word: word: " into one.
func dedupPrefixes(msg string) string {
	parts := strings.Split(msg, ": ")
	out := parts[:1]
	for _, p := range parts[1:] {
		if p == out[len(out)-1] && !strings.ContainsAny(p, " \t") {
			continue
		}
		out = append(out, p)
	}
	return strings.Join(out, ": ")
}
