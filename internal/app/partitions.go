package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/verify"
)

const partitionsUsage = `jetinbox partitions: the partitions of a sharded stream and the shards that own them.

  jetinbox partitions list -shards FILE [-v]     each shard's partitions, as its database says, against the map file
  jetinbox partitions stream -shards FILE        create the stream with its partition transform, dead-letter and advisory streams
  jetinbox partitions move P --to B -shards FILE move partition P to shard B while every shard runs, then rewrite FILE;
                                                 a move stopped halfway: run it again to the same B, or to its source to give P back;
                                                 with shard_durables in FILE it makes P's hand-off durable (NATS flags as for stream)`

// Partitions is `jetinbox partitions`.
func Partitions(ctx context.Context, args []string, env cli.Env, _ io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stderr, partitionsUsage+"\n\n"+cli.ExitCodes)
		if len(args) == 0 {
			return cli.UsageError{Err: errors.New("partitions: no subcommand")}
		}
		return flag.ErrHelp
	}
	sub := args[0]
	fs := cli.NewFlagSet("jetinbox partitions "+sub, partitionsUsage, stderr)
	var sf cli.ShardFlags
	sf.Register(fs, env)
	var nf cli.NATSFlags
	if sub == "stream" || sub == "move" {
		// move: a map with shard_durables makes the partition's hand-off
		// durable.
		nf.Register(fs, env)
	}
	to := fs.String("to", "", "move: the shard that takes the partition")
	verbose := fs.Bool("v", false, "list: one line per partition with its durable, filter and owners")
	replicas := fs.Int("replicas", 1, "stream: replicas of the streams (3 in production)")
	window := fs.Duration("duplicate-window", jsinbox.DefaultDuplicateWindow, "stream: the duplicate window; it must cover the producers' retries")
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	m, _, err := sf.Load(false)
	if err != nil {
		return err
	}
	log := cli.EnvLogger(stderr, env, slog.LevelInfo)
	switch sub {
	case "list":
		if len(pos) > 0 {
			return cli.UsageError{Err: errors.New("partitions list: unexpected arguments")}
		}
		return listPartitions(ctx, m, env, *verbose, stdout, log)
	case "stream":
		if len(pos) > 0 {
			return cli.UsageError{Err: errors.New("partitions stream: unexpected arguments")}
		}
		nc, js, err := connectPartitions(&nf, log)
		if err != nil {
			return err
		}
		defer nc.Close()
		if err := m.EnsureStream(ctx, js, jsinbox.StreamConfig{Replicas: *replicas, DuplicateWindow: *window}); err != nil {
			return err
		}
		src, dest := m.SubjectTransform()
		fmt.Fprintf(stdout, "stream %s: %s → %s (and %s, %s)\n", m.Stream, src, dest, jsinbox.DeadLetterStream(m.Stream), jsinbox.AdvisoryStream(m.Stream))
		return nil
	case "move":
		if len(pos) != 1 || *to == "" {
			return cli.UsageError{Err: errors.New("partitions move: want one partition and --to SHARD: jetinbox partitions move P --to B -shards FILE")}
		}
		p, err := strconv.Atoi(pos[0])
		if err != nil || p < 0 || p >= m.Partitions {
			return cli.UsageError{Err: fmt.Errorf("partitions move: %q is not a partition of 0-%d", pos[0], m.Partitions-1)}
		}
		var mo shard.MoveOptions
		if m.ShardDurables {
			nc, js, err := connectPartitions(&nf, log)
			if err != nil {
				return err
			}
			defer nc.Close()
			mo.JS = js
		}
		return movePartition(ctx, m, sf.File, p, *to, mo, env, stdout, log)
	}
	return cli.UsageError{Err: fmt.Errorf("partitions: unknown subcommand %q (list, stream, move)", sub)}
}

// connectPartitions connects to NATS with the command's flags; a bad flag
// or a server that cannot be reached is a usage error.
func connectPartitions(nf *cli.NATSFlags, log *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	if err := nf.Validate(); err != nil {
		return nil, nil, cli.UsageError{Err: err}
	}
	nc, js, err := nf.Connect("jetinbox-partitions", cli.DefaultReconnect(), log)
	if err != nil {
		return nil, nil, cli.UsageError{Err: err}
	}
	return nc, js, nil
}

// parseInterspersed parses flags that may come before or after the
// positional arguments ("move 7 --to b").
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := cli.Parse(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// shardOwned is what one shard's database says.
type shardOwned struct {
	owned shard.Set
	// movedTo is, per partition the shard gave away, the shard it was
	// given to ("" if its row names none).
	movedTo map[int]string
	err     error
}

func readOwned(ctx context.Context, m *shard.Map, env cli.Env, log *slog.Logger) []shardOwned {
	out := make([]shardOwned, len(m.Shards))
	for i := range m.Shards {
		st, err := cli.OpenShard(ctx, &m.Shards[i], env, 1, log)
		if err != nil {
			out[i].err = err
			continue
		}
		rows, err := shard.Rows(ctx, st.PG, m.Scope)
		st.Close()
		if err != nil {
			out[i].err = err
			continue
		}
		out[i].movedTo = map[int]string{}
		for _, r := range rows {
			if r.Owned {
				out[i].owned = append(out[i].owned, r.Partition)
			} else {
				out[i].movedTo[r.Partition] = r.MovedTo
			}
		}
	}
	return out
}

func listPartitions(ctx context.Context, m *shard.Map, env cli.Env, verbose bool, stdout io.Writer, log *slog.Logger) error {
	owned := readOwned(ctx, m, env, log)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "shard\tpartitions (database)\tpartitions (map file)\tstate")
	bad := 0
	owners := map[int][]string{}
	for i, s := range m.Shards {
		o := owned[i]
		state := "ok"
		switch {
		case o.err != nil:
			state, bad = "UNREADABLE: "+o.err.Error(), bad+1
		case !slices.Equal(o.owned, s.Partitions):
			state = "differs from the map file (a move not written back, or a stale file)"
		}
		for _, p := range o.owned {
			owners[p] = append(owners[p], s.Name)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, o.owned, s.Partitions, state)
	}
	tw.Flush()
	var none shard.Set
	for p := range m.Partitions {
		switch n := len(owners[p]); {
		case n == 0:
			none = append(none, p)
		case n > 1:
			fmt.Fprintf(stdout, "partition %d: owned by %v: VIOLATION\n", p, owners[p])
			bad++
		}
	}
	if len(none) > 0 && bad == 0 {
		// A move between its fence and its copy, or a shard not migrated.
		for _, p := range none {
			from, to := stuckMove(m, owned, p)
			switch {
			case from == "":
				fmt.Fprintf(stdout, "partition %d: owned by no shard and given away by none (a shard not migrated? run jetinbox migrate -shards FILE -shard NAME)\n", p)
			case to == "":
				fmt.Fprintf(stdout, "partition %d: owned by no shard: %s gave it away, naming no target (a move stopped halfway): run: jetinbox partitions move %d --to SHARD -shards FILE, or give it back: --to %s\n", p, from, p, from)
			default:
				fmt.Fprintf(stdout, "partition %d: owned by no shard: a move from %s to %s stopped halfway: run: jetinbox partitions move %d --to %s -shards FILE (or give it back: --to %s)\n", p, from, to, p, to, from)
			}
		}
		bad++
	}
	if m.ShardDurables {
		fmt.Fprintf(stdout, "stream %s, %d partitions, scope %q, one durable per shard: %s\n", m.Stream, m.Partitions, m.Scope, strings.Join(m.ConsumerDurables(), ", "))
	} else {
		fmt.Fprintf(stdout, "stream %s, %d partitions, scope %q, durables %s\n", m.Stream, m.Partitions, m.Scope, m.Durable(0)+"…")
	}
	if verbose {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "partition\tdurable\tfilter\towner (database)\towner (map file)")
		for p := range m.Partitions {
			owner := "none"
			if len(owners[p]) > 0 {
				owner = strings.Join(owners[p], ",")
			}
			durable := m.Durable(p)
			if m.ShardDurables {
				durable = "-"
				if len(owners[p]) == 1 {
					durable = m.ShardDurable(owners[p][0])
				}
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", p, durable, m.Filter(p), owner, m.Owner(p))
		}
		tw.Flush()
	}
	if bad > 0 {
		return errors.New("partitions: some partitions are owned twice, by none, or a shard cannot be read")
	}
	return nil
}

// stuckMove finds the move of partition p, owned by no shard, that stopped
// after its fence: its source is the map file's owner (the file is written
// last) if that shard gave p away, else the one shard that gave p to a
// shard that does not own it. It returns the source and the target its row
// names ("" if none).
func stuckMove(m *shard.Map, owned []shardOwned, p int) (from, to string) {
	if i := slices.IndexFunc(m.Shards, func(s shard.Shard) bool { return s.Name == m.Owner(p) }); i >= 0 {
		if t, ok := owned[i].movedTo[p]; ok {
			return m.Shards[i].Name, t
		}
	}
	for i := range m.Shards {
		if t, ok := owned[i].movedTo[p]; ok {
			if from != "" {
				return "", "" // more than one: the file must say
			}
			from, to = m.Shards[i].Name, t
		}
	}
	return from, to
}

func movePartition(ctx context.Context, m *shard.Map, file string, p int, to string, mo shard.MoveOptions, env cli.Env, stdout io.Writer, log *slog.Logger) error {
	toShard, err := m.Shard(to)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	owned := readOwned(ctx, m, env, log)
	var owners []int
	for i, o := range owned {
		if o.err != nil {
			return fmt.Errorf("partitions move: shard %s: %w", m.Shards[i].Name, o.err)
		}
		if slices.Contains(o.owned, p) {
			owners = append(owners, i)
		}
	}
	var from int
	switch len(owners) {
	case 0:
		// A move that stopped after its fence: its source is the shard
		// that gave it away, the map file's owner (the file is written last).
		name, target := stuckMove(m, owned, p)
		from = slices.IndexFunc(m.Shards, func(s shard.Shard) bool { return s.Name == name })
		if from < 0 {
			return fmt.Errorf("partitions move: no shard owns partition %d, and none gave it away: run jetinbox partitions list", p)
		}
		if name == to {
			// Back to the source: give it back there, if the target its
			// row names did not take it.
			return unfencePartition(ctx, m, file, p, from, target, mo, env, stdout, log)
		}
		log.Info("partitions: no shard owns the partition: finishing a move that stopped halfway", "partition", p, "from", name, "recorded_target", target)
	case 1:
		from = owners[0]
	default:
		return fmt.Errorf("partitions move: partition %d is owned by more than one shard; run jetinbox partitions list", p)
	}
	if m.Shards[from].Name == to {
		if m.Owner(p) == to {
			return cli.UsageError{Err: fmt.Errorf("partitions move: shard %s owns partition %d already", to, p)}
		}
		// Moved, but the map file was not written: write it.
		nm, err := m.Move(p, to)
		if err != nil {
			return err
		}
		if err := nm.Save(file); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "partition %d: %s owns it already; %s rewritten\n", p, to, file)
		return nil
	}
	src, err := cli.OpenShard(ctx, &m.Shards[from], env, 2, log)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := cli.OpenShard(ctx, toShard, env, 2, log)
	if err != nil {
		return err
	}
	defer dst.Close()
	res, err := shard.MoveWith(ctx, m, p, shard.Side{Name: m.Shards[from].Name, Pool: src.PG}, shard.Side{Name: to, Pool: dst.PG}, mo)
	if err != nil {
		return err
	}
	nm, err := m.Move(p, to)
	if err != nil {
		return err
	}
	if err := nm.Save(file); err != nil {
		return fmt.Errorf("partitions move: the partition moved, but the map file was not written (run the move again to write it): %w", err)
	}
	if m.ShardDurables {
		fmt.Fprintf(stdout, "partition %d: %s → %s, %d inbox rows copied; %s reads it through the hand-off durable %s until its own durable covers it; %s rewritten\n",
			p, m.Shards[from].Name, to, res.Copied, to, m.HandOff(p), file)
		return nil
	}
	fmt.Fprintf(stdout, "partition %d: %s → %s, %d inbox rows copied; durable %s carries on at %s; %s rewritten\n",
		p, m.Shards[from].Name, to, res.Copied, m.Durable(p), to, file)
	return nil
}

// unfencePartition gives partition p back to shard from, which gave it
// away to target ("" for none) in a move that stopped before target took
// it.
func unfencePartition(ctx context.Context, m *shard.Map, file string, p, from int, target string, mo shard.MoveOptions, env cli.Env, stdout io.Writer, log *slog.Logger) error {
	src, err := cli.OpenShard(ctx, &m.Shards[from], env, 2, log)
	if err != nil {
		return err
	}
	defer src.Close()
	t := shard.Side{Name: target}
	if target != "" {
		ts, err := m.Shard(target)
		if err != nil {
			return fmt.Errorf("partitions move: %s gave partition %d to %q, which the map file does not name: %w", m.Shards[from].Name, p, target, err)
		}
		dst, err := cli.OpenShard(ctx, ts, env, 2, log)
		if err != nil {
			return err
		}
		defer dst.Close()
		t.Pool = dst.PG
	}
	if _, err := shard.UnfenceWith(ctx, m, p, shard.Side{Name: m.Shards[from].Name, Pool: src.PG}, t, mo); err != nil {
		return fmt.Errorf("partitions move: %w", err)
	}
	if m.Owner(p) != m.Shards[from].Name {
		nm, err := m.Move(p, m.Shards[from].Name)
		if err != nil {
			return err
		}
		if err := nm.Save(file); err != nil {
			return fmt.Errorf("partitions move: the partition is back, but the map file was not written (run the move again to write it): %w", err)
		}
	}
	fmt.Fprintf(stdout, "partition %d: given back to %s (the move to %s had not taken it)\n", p, m.Shards[from].Name, cmp.Or(target, "no shard"))
	return nil
}

// migrateShard applies the schemas to one shard's database and records the
// partitions the map gives it, where its table has no row for them yet.
func migrateShard(ctx context.Context, sf cli.ShardFlags, env cli.Env, stdout, stderr io.Writer) error {
	m, s, err := sf.Load(true)
	if err != nil {
		return err
	}
	store, err := cli.OpenShard(ctx, s, env, 2, cli.EnvLogger(stderr, env, slog.LevelInfo))
	if err != nil {
		return err
	}
	defer store.Close()
	n, l, err := store.Migrate(ctx)
	if err != nil {
		return err
	}
	// A shard runs no outbox, but grants.sql, which every jetinbox
	// database gets after its migrate, names the outbox's tables.
	o, err := store.Outbox().Migrate(ctx)
	if err != nil {
		return err
	}
	k, err := shard.Migrate(ctx, store.PG, m, s.Name)
	if err != nil {
		return err
	}
	owned, err := shard.Owned(ctx, store.PG, m.Scope)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "shard %s: applied %d inbox, %d ledger, %d outbox and %d shard migrations; owns partitions %s\n", s.Name, n, l, o, k, owned)
	return nil
}

// verifyShards checks the sharded stream against every shard at once.
func verifyShards(ctx context.Context, sf cli.ShardFlags, nf *cli.NATSFlags, env cli.Env, asJSON bool, stdout, stderr io.Writer) error {
	m, _, err := sf.Load(false)
	if err != nil {
		return err
	}
	if err := nf.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	log := cli.EnvLogger(stderr, env, slog.LevelInfo)
	dbs := make([]verify.ShardDB, len(m.Shards))
	for i := range m.Shards {
		st, err := cli.OpenShard(ctx, &m.Shards[i], env, 2, log)
		if err != nil {
			return cli.UsageError{Err: err}
		}
		defer st.Close()
		dbs[i] = verify.ShardDB{Name: m.Shards[i].Name, DB: st.PG}
	}
	nc, js, err := nf.Connect("jetinbox-verify", cli.DefaultReconnect(), log)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	defer nc.Close()
	r, err := verify.Shards(ctx, js, m.Stream, m.Scope, dbs, m.ConsumerDurables()...)
	if err != nil {
		return cli.UsageError{Err: streamMissing("verify", m.Stream, err)}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		r.WriteTable(stdout)
	}
	if !r.Clean() {
		return errViolations
	}
	return nil
}
