package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/dlq"
	"github.com/jetinbox/jetinbox/internal/shard"
)

// DLQ lists, shows and re-drives one scope's dead letters.
//
// A re-drive publishes the dead letter's original intent again, with its
// original ID, subject and payload, into the intents stream, so that the
// inbox decides again: a rejected inbox row of that ID is deleted first
// (an applied one stays, and the intent is not published). Conflicts are
// not re-driven: their ID is applied with another payload.
//
// What is published is the original as the intents stream holds it, read
// by the stream sequence the dead letter names, never the dead letter's
// own copy: a key that may publish dead letters (every consumer's) could
// otherwise have any intent applied by writing one. A dead letter whose
// sequence holds another ID or subject, or nothing any more (aged out), is
// refused and reported, and the command exits 1.
func DLQ(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("jetinbox dlq", "List one scope's dead letters with counts by reason (the default), -show one, or -redrive a selection\n"+
		"after fixing the cause: each intent is published again with its original ID so the inbox decides again\n"+
		"(its rejected inbox row is deleted first; an applied ID stays applied). What is published is the original read back\n"+
		"from the intents stream at the dead letter's stream sequence; a dead letter whose original is gone or is another\n"+
		"message there is refused. Exit 0 ok, 1 failure or a refused dead letter, 2 usage error.", stderr)
	var nf cli.NATSFlags
	nf.Register(fs, env)
	dbURL := cli.DatabaseFlag(fs, env, cli.DatabaseUsage)
	stream := cli.StreamFlag(fs, env, "intents stream (its dead letters are in <stream>_DLQ)")
	scope := cli.ScopeFlag(fs, env)
	show := fs.Uint64("show", 0, "print the dead letter at this sequence of the dead-letter stream: headers and payload")
	redrive := fs.Bool("redrive", false, "re-drive the selected dead letters (-all, -id, -seq or -reason)")
	all := fs.Bool("all", false, "select every dead letter of the scope")
	ids := fs.String("id", "", "select by original message ID (comma-separated)")
	seqs := fs.String("seq", "", "select by dead-letter stream sequence (comma-separated)")
	reason := fs.String("reason", "", "select the dead letters whose reason contains this text")
	var sf cli.ShardFlags
	sf.Register(fs, env)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var shards *shard.Map
	if sf.File != "" {
		// A sharded stream: its stream and scope come from the map, and a
		// re-drive goes to the shard that owns the ID's partition now.
		m, _, err := sf.Load(false)
		if err != nil {
			return err
		}
		shards = m
		*stream, *scope = shards.Stream, shards.Scope
	}
	if fs.NArg() > 0 {
		return cli.UsageError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	sel, err := dlq.NewSelection(*all, *ids, *seqs, *reason)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	if *redrive && sel.Empty() {
		return cli.UsageError{Err: errors.New("-redrive needs a selection: -all, -id, -seq or -reason")}
	}
	if err := nf.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	if err := cli.CheckScope(*scope); err != nil {
		return err
	}
	log := cli.EnvLogger(stderr, env, slog.LevelInfo)
	nc, js, err := nf.Connect("jetinbox-dlq", cli.DefaultReconnect(), log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer nc.Close()
	dead, err := dlq.Read(ctx, js, *stream, *scope)
	if err != nil {
		return err
	}
	if *show != 0 {
		for _, d := range dead {
			if d.Seq == *show {
				d.Print(stdout)
				return nil
			}
		}
		return fmt.Errorf("dlq: no dead letter of scope %q at sequence %d of %s", *scope, *show, jsinbox.DeadLetterStream(*stream))
	}
	picked := dead
	if !sel.Empty() {
		picked = picked[:0:0]
		for _, d := range dead {
			if sel.Match(d) {
				picked = append(picked, d)
			}
		}
	}
	if !*redrive {
		dlq.List(stdout, dead, picked, *stream, *scope)
		return nil
	}
	if shards != nil {
		route, closeAll, err := dlq.ShardRoute(ctx, shards, env, log)
		if err != nil {
			return err
		}
		defer closeAll()
		return dlq.Redrive(ctx, stdout, js, nil, route, *stream, *scope, picked)
	}
	if err := cli.RequireDatabase(*dbURL); err != nil {
		return err
	}
	store, err := cli.OpenStore(ctx, *dbURL, 2, log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer store.Close()
	// A re-drive deletes rejected inbox rows: refuse a database that
	// cannot take that before anything is published.
	if err := store.CheckWritable(ctx); err != nil {
		return fmt.Errorf("dlq: %w", err)
	}
	return dlq.Redrive(ctx, stdout, js, store, nil, *stream, *scope, picked)
}
