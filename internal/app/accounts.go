package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/effects"
)

// maxOpen bounds how many accounts one call opens.
const maxOpen = 10_000_000

// Accounts opens and lists the ledger's accounts. The ledger credits only
// accounts that exist: a credit to another is dead-lettered as "unknown
// account N", so an operator opens accounts before intents for them arrive.
func Accounts(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox accounts", "Open ledger accounts (-open), or list them with their balances (-list).\n"+
		"The ledger credits only accounts that exist; a credit to another is dead-lettered as \"unknown account N\".", stderr)
	dbURL := cli.DatabaseFlag(fs, env, cli.DatabaseUsage)
	open := fs.String("open", "", "accounts to open, by ID: a list of IDs and ranges such as 1-1024 or 7,9,20-30; accounts that exist are left as they are")
	list := fs.Bool("list", false, "print every account and its balance")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if *open == "" && !*list {
		return cli.UsageError{Err: errors.New("nothing to do: give -open IDS or -list")}
	}
	var ids []int64
	if *open != "" {
		var err error
		if ids, err = parseIDs(*open); err != nil {
			return cli.UsageError{Err: fmt.Errorf("-open: %w", err)}
		}
	}
	if err := cli.RequireDatabase(*dbURL); err != nil {
		return err
	}
	store, err := cli.OpenStore(ctx, *dbURL, 2, cli.EnvLogger(stderr, env, slog.LevelInfo))
	if err != nil {
		return err
	}
	defer store.Close()
	if len(ids) > 0 {
		var n int
		if store.SQLite != nil {
			n, err = effects.OpenAccountsSQLite(ctx, store.SQLite, ids)
		} else {
			n, err = effects.OpenAccounts(ctx, store.PG, ids)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "opened %d accounts (%d asked for, %d existed)\n", n, len(ids), len(ids)-n)
	}
	if *list {
		const q = `SELECT id, balance FROM accounts ORDER BY id`
		var rows interface {
			Next() bool
			Scan(...any) error
			Err() error
		}
		if store.SQLite != nil {
			r, err := store.SQLite.QueryContext(ctx, q)
			if err != nil {
				return fmt.Errorf("accounts: %w", err)
			}
			defer r.Close()
			rows = r
		} else {
			r, err := store.PG.Query(ctx, q)
			if err != nil {
				return fmt.Errorf("accounts: %w", err)
			}
			defer r.Close()
			rows = r
		}
		for rows.Next() {
			var id, bal int64
			if err := rows.Scan(&id, &bal); err != nil {
				return fmt.Errorf("accounts: %w", err)
			}
			fmt.Fprintf(stdout, "%d\t%d\n", id, bal)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("accounts: %w", err)
		}
	}
	return nil
}

// parseIDs reads "1-1024,2000,7" into account IDs (positive, at most
// maxOpen of them).
func parseIDs(s string) ([]int64, error) {
	var ids []int64
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseInt(lo, 10, 64)
		if err != nil || a < 1 {
			return nil, fmt.Errorf("%q: account IDs are positive integers", part)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseInt(hi, 10, 64); err != nil || b < a {
				return nil, fmt.Errorf("%q: a range is LOW-HIGH with LOW <= HIGH", part)
			}
		}
		if int64(len(ids))+b-a+1 > maxOpen {
			return nil, fmt.Errorf("more than %d accounts at once", maxOpen)
		}
		for id := a; id <= b; id++ {
			ids = append(ids, id)
		}
	}
	return ids, nil
}
