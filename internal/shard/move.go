package shard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/pgwatch"
)

// MoveResult says what a move did.
type MoveResult struct {
	Partition int
	// Copied is how many inbox rows of the partition went to the target.
	Copied int64
	// Resumed is true when the source had given the partition away
	// already (an earlier move stopped halfway) and this one finished it.
	Resumed bool
	// Already is true when the target owned the partition already.
	Already bool
}

// moveLockTimeout bounds the fence's wait for the source's batches in
// flight: they hold the partition's row for one transaction each.
const moveLockTimeout = "30s"

// Side is one end of a move: the shard's name in the map and its database.
type Side struct {
	Name string
	Pool *pgxpool.Pool
}

// MoveOptions changes how a move checks its source; the zero value is the
// shipped move.
type MoveOptions struct {
	// UnsafeAnyGivenAway restores a check that is not safe, for the chaos
	// run to show what it loses: a resumed move carries on whenever the
	// source's row says the partition was given away, to whichever shard,
	// and the target takes it without looking at the source's row. Two
	// moves of one partition to two targets then both succeed.
	UnsafeAnyGivenAway bool
	// JS is the JetStream the hand-off durable is made on; a map with
	// [Map.ShardDurables] needs it.
	JS jetstream.JetStream
	// UnsafeNoHandOff, with [Map.ShardDurables], moves a partition
	// without a hand-off durable, for the chaos run to show what it
	// loses: the source acks what it still gets of the partition, and the
	// target's durable takes the partition from where it stands, past the
	// messages the source had not applied.
	UnsafeNoHandOff bool

	// beforeFence, if set, runs between the hand-off and the fence
	// (tests race a give-back there).
	beforeFence func()
}

// ErrOtherTarget is the error of a move whose source gave the partition to
// another shard than the move's target: that move must be finished (or the
// partition moved back to its source) first.
var ErrOtherTarget = errors.New("shard: the partition was given to another shard")

// ErrMoveFinished is the error of a move, or a give-back, whose target took
// the partition at a later point than the source's row records: the move
// finished long ago and the partition may have moved on since (a stale run
// of the move command). Run jetinbox partitions list to see who owns it.
var ErrMoveFinished = errors.New("shard: the target took the partition since the source gave it away")

// Move takes partition p from the shard from and gives it to the shard to,
// while both run:
//
//  1. fence: in from, the partition's row is set not owned and names to,
//     in one statement. The UPDATE waits for the batches applying p to
//     commit (they hold the row FOR SHARE); once it commits no transaction
//     there applies p, and from's runner stops p's consumer within its
//     poll (what it still holds is nak'd);
//  2. copy: in one transaction in to, which runs while from's row is held
//     FOR SHARE and only if that row still names to, every inbox row of
//     the scope whose ID is in p is copied from from in pages (keeping its
//     status, fingerprint, subject and time; a row to kept from an earlier
//     time it owned p gives way to from's, the later), and the partition's
//     row set owned;
//  3. to's runner starts p's durable, which carries on where from left
//     off: what from applied but did not ack comes back to to as a
//     duplicate of a copied row.
//
// Messages of p wait in their durable between 1 and 3; no other partition
// stops. A move that failed halfway can be run again to the same target:
// it finishes. A move to another target is refused with [ErrOtherTarget]
// until the first is finished or [Unfence] gave the partition back.
func Move(ctx context.Context, m *Map, p int, from, to Side) (MoveResult, error) {
	return MoveWith(ctx, m, p, from, to, MoveOptions{})
}

// MoveWith is [Move] with options.
func MoveWith(ctx context.Context, m *Map, p int, from, to Side, o MoveOptions) (MoveResult, error) {
	res := MoveResult{Partition: p}
	if p < 0 || p >= m.Partitions {
		return res, fmt.Errorf("shard: partition %d out of range 0-%d", p, m.Partitions-1)
	}
	if from.Name == "" || to.Name == "" || from.Name == to.Name {
		return res, fmt.Errorf("shard: a move needs two shards by name, got %q and %q", from.Name, to.Name)
	}
	toOwns, err := owns(ctx, to.Pool, m.Scope, p)
	if err != nil {
		return res, fmt.Errorf("shard: target %s: %w", to.Name, err)
	}
	if toOwns {
		res.Already = true
		return res, nil
	}
	if !o.UnsafeAnyGivenAway {
		if err := notTakenSince(ctx, m, p, from, to); err != nil {
			return res, err
		}
	}
	// 0. With one durable per shard, the hand-off durable first, so that
	// it exists before the source refuses a message of p.
	var (
		handOffFrom *uint64
		sawOwned    bool
	)
	if m.ShardDurables {
		start, owned, err := prepareHandOff(ctx, m, p, from, to, o)
		if err != nil {
			return res, err
		}
		handOffFrom, sawOwned = &start, owned
	}
	if o.beforeFence != nil {
		o.beforeFence()
	}
	// 1. The fence.
	tx, err := from.Pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if err := moveSettings(ctx, tx); err != nil {
		return res, fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	tag, err := tx.Exec(ctx, `UPDATE jetinbox_partitions SET owned = false, moved_to = $3, handoff_from = $4, changed_at = now() WHERE scope = $1 AND partition = $2 AND owned`, m.Scope, p, to.Name, handOffFrom)
	if err != nil {
		return res, fmt.Errorf("shard: fence partition %d in the source %s: %w", p, from.Name, err)
	}
	if tag.RowsAffected() == 0 {
		// Not owned there: an earlier move fenced it and stopped. Moving
		// it from a shard that never had it would copy nothing and could
		// leave it owned twice, so insist on a row saying it was given
		// away, and to this target.
		if err := resumeCheck(ctx, tx, m, p, from.Name, to.Name, o); err != nil {
			return res, err
		}
		res.Resumed = true
		if handOffFrom != nil {
			// Fenced before the hand-off's start was recorded (a fence of
			// a durable per partition): record it now.
			if _, err := tx.Exec(ctx, `UPDATE jetinbox_partitions SET handoff_from = $3 WHERE scope = $1 AND partition = $2 AND NOT owned AND handoff_from IS NULL`, m.Scope, p, handOffFrom); err != nil {
				return res, fmt.Errorf("shard: source %s: record the hand-off of partition %d: %w", from.Name, p, err)
			}
		}
	} else if m.ShardDurables && !o.UnsafeNoHandOff {
		// Fenced now, with the row locked: the hand-off made for it must
		// be this move's still (a give-back in between hands it to the
		// source under the same lock), and made for an owned row, after
		// the source's rescue was checked.
		if !sawOwned {
			return res, fmt.Errorf("shard: partition %d was given back to %s while the move prepared its hand-off: run the move again", p, from.Name)
		}
		if err := handOffStill(ctx, m, o.JS, p, from.Name, to.Name); err != nil {
			return res, err
		}
	}
	// The fence must be as durable as the target's taking will be: a
	// resumed move that changed no row writes WAL of its own, so that its
	// COMMIT too waits for the source's synchronous standby, and a COMMIT
	// whose wait was cancelled (committed on the source's primary only)
	// stops the move. Else a failover of the source after the target took
	// the partition would bring back a source that owns it too.
	if err := pgwatch.ReadPriorCommits(ctx, tx); err != nil {
		return res, fmt.Errorf("shard: fence partition %d in the source %s: %w", p, from.Name, err)
	}
	if err := pgwatch.Commit(ctx, tx); err != nil {
		return res, fmt.Errorf("shard: fence partition %d in the source %s (run the move again once its commits are confirmed): %w", p, from.Name, err)
	}
	// 2. Copy the partition's inbox rows and take it, in one transaction.
	n, err := copyRows(ctx, m, p, from, to, o)
	res.Copied = n
	return res, err
}

// moveSettings lifts the statement timeout for a move's own transaction (a
// page of a large inbox may take longer than the server's bound for a
// batch) and bounds its waits for locks.
func moveSettings(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = '"+moveLockTimeout+"'")
	return err
}

// resumeCheck is the fence of a move resumed: the source's row must say
// the partition was given away to the move's target (or, fenced before
// targets were recorded, to nobody yet: then it names it now). It takes no
// lock a copy in progress holds: the copy re-checks the row under its own.
func resumeCheck(ctx context.Context, tx pgx.Tx, m *Map, p int, from, to string, o MoveOptions) error {
	var (
		owned   bool
		movedTo *string
	)
	err := tx.QueryRow(ctx, `SELECT owned, moved_to FROM jetinbox_partitions WHERE scope = $1 AND partition = $2`, m.Scope, p).Scan(&owned, &movedTo)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("shard: the source %s never owned partition %d (its table has no row for it): check the map and run jetinbox partitions list", from, p)
	}
	if err != nil {
		return fmt.Errorf("shard: source %s: %w", from, err)
	}
	switch {
	case o.UnsafeAnyGivenAway:
	case owned:
		// Given back between the UPDATE and this read.
		return fmt.Errorf("shard: partition %d is owned by the source %s again: run the move again", p, from)
	case movedTo == nil:
		tag, err := tx.Exec(ctx, `UPDATE jetinbox_partitions SET moved_to = $3, changed_at = now() WHERE scope = $1 AND partition = $2 AND NOT owned AND moved_to IS NULL`, m.Scope, p, to)
		if err != nil {
			return fmt.Errorf("shard: source %s: name the target of partition %d: %w", from, p, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("shard: the row of partition %d in %s changed meanwhile: run jetinbox partitions list, then the move again", p, from)
		}
	case *movedTo != to:
		return fmt.Errorf("%w: %s gave partition %d to shard %s, not %s: finish that move (jetinbox partitions move %d --to %s) or move it back (--to %s)",
			ErrOtherTarget, from, p, *movedTo, to, p, *movedTo, from)
	}
	return nil
}

// copyPage is how many of the source's inbox rows of the scope one page
// reads: each page is two short statements on the primary key, whatever
// the inbox's size, and writes the partition's share of them (about
// copyPage / partitions) to the target.
const copyPage = 20000

// copyRows copies partition p's inbox rows from from to to and sets p owned
// in to, in one transaction there, while from's row of p is held FOR SHARE:
// it runs only if that row says p was given to to, and no [Unfence] of p in
// from can commit until to's transaction has ended.
func copyRows(ctx context.Context, m *Map, p int, from, to Side, o MoveOptions) (int64, error) {
	stx, err := from.Pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	defer stx.Rollback(ctx) //nolint:errcheck // read only: rolled back
	if err := moveSettings(ctx, stx); err != nil {
		return 0, fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	var epoch int64
	if !o.UnsafeAnyGivenAway {
		var (
			owned   bool
			movedTo *string
		)
		err := stx.QueryRow(ctx, `SELECT owned, moved_to, epoch FROM jetinbox_partitions WHERE scope = $1 AND partition = $2 FOR SHARE`, m.Scope, p).Scan(&owned, &movedTo, &epoch)
		if err != nil {
			return 0, fmt.Errorf("shard: source %s: the row of partition %d: %w", from.Name, p, err)
		}
		switch {
		case owned:
			return 0, fmt.Errorf("shard: partition %d is owned by the source %s again (moved back meanwhile): not taken by %s", p, from.Name, to.Name)
		case movedTo == nil || *movedTo != to.Name:
			named := "no shard"
			if movedTo != nil {
				named = *movedTo
			}
			return 0, fmt.Errorf("%w: the source %s names %s as the target of partition %d, not %s: not taken", ErrOtherTarget, from.Name, named, p, to.Name)
		}
	}
	tx, err := to.Pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("shard: target %s: %w", to.Name, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if err := moveSettings(ctx, tx); err != nil {
		return 0, fmt.Errorf("shard: target %s: %w", to.Name, err)
	}
	var (
		copied int64
		after  string
	)
	for {
		// The page: the next copyPage IDs of the scope, on the primary key.
		var end *string
		if err := stx.QueryRow(ctx, `SELECT max(message_id) FROM (SELECT message_id FROM inbox WHERE scope = $1 AND message_id > $2 ORDER BY message_id LIMIT $3) page`,
			m.Scope, after, copyPage).Scan(&end); err != nil {
			return copied, fmt.Errorf("shard: read the source's inbox: %w", err)
		}
		if end == nil {
			break
		}
		n, err := copyPageRows(ctx, stx, tx, m, p, after, *end)
		copied += n
		if err != nil {
			return copied, err
		}
		after = *end
	}
	// Taken with the source's epoch plus one, over a row of the target's
	// only if that is older (the unsafe check takes it whatever it holds).
	take := `INSERT INTO jetinbox_partitions (scope, partition, owned, epoch) VALUES ($1, $2, true, $3)
ON CONFLICT (scope, partition) DO UPDATE SET owned = true, moved_to = NULL, handoff_from = NULL, epoch = excluded.epoch, changed_at = now()`
	if !o.UnsafeAnyGivenAway {
		take += ` WHERE jetinbox_partitions.epoch < excluded.epoch`
	}
	tag, err := tx.Exec(ctx, take, m.Scope, p, epoch+1)
	if err != nil {
		return copied, fmt.Errorf("shard: take partition %d in the target %s: %w", p, to.Name, err)
	}
	if tag.RowsAffected() == 0 {
		return copied, fmt.Errorf("%w: %s's row of partition %d is newer than %s's: not taken again", ErrMoveFinished, to.Name, p, from.Name)
	}
	if err := pgwatch.Commit(ctx, tx); err != nil {
		return copied, fmt.Errorf("shard: take partition %d in the target %s: %w", p, to.Name, err)
	}
	return copied, nil
}

// copyPageRows copies the rows of partition p whose IDs are in (after,
// end], filtered in the source by jetinbox_partition_of.
func copyPageRows(ctx context.Context, src, dst pgx.Tx, m *Map, p int, after, end string) (int64, error) {
	rows, err := src.Query(ctx, `SELECT message_id, fingerprint, status, reason, stream_seq, subject, received_at FROM inbox
WHERE scope = $1 AND message_id > $2 AND message_id <= $3 AND jetinbox_partition_of(message_id, $4) = $5`, m.Scope, after, end, m.Partitions, p)
	if err != nil {
		return 0, fmt.Errorf("shard: read the source's inbox: %w", err)
	}
	var (
		ids, statuses, subjects []string
		reasons                 []*string
		fps                     [][]byte
		seqs                    []int64
		ats                     []time.Time
	)
	for rows.Next() {
		var (
			id, status, subject string
			reason              *string
			fp                  []byte
			seq                 int64
			at                  time.Time
		)
		if err := rows.Scan(&id, &fp, &status, &reason, &seq, &subject, &at); err != nil {
			rows.Close()
			return 0, fmt.Errorf("shard: read the source's inbox: %w", err)
		}
		ids, fps, statuses, reasons, seqs, subjects, ats = append(ids, id), append(fps, fp), append(statuses, status), append(reasons, reason), append(seqs, seq), append(subjects, subject), append(ats, at)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("shard: read the source's inbox: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	tag, err := dst.Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint, status, reason, stream_seq, subject, received_at)
SELECT $1, * FROM unnest($2::text[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::timestamptz[])
ON CONFLICT (scope, message_id) DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status, reason = excluded.reason,
	stream_seq = excluded.stream_seq, subject = excluded.subject, received_at = excluded.received_at`, m.Scope, ids, fps, statuses, reasons, seqs, subjects, ats)
	if err != nil {
		return 0, fmt.Errorf("shard: copy inbox rows to the target: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Row is a shard's row of one partition.
type Row struct {
	Partition int
	Owned     bool
	// MovedTo is the shard a partition not owned was given to ("" when
	// owned, or fenced before targets were recorded).
	MovedTo string
	// HandOffFrom, on a partition given away with [Map.ShardDurables], is
	// the first stream sequence its hand-off durable delivers: the shard
	// acks without applying what reaches it of the partition from there.
	// 0 otherwise.
	HandOffFrom uint64
}

// Rows returns every row of the scope in a shard's partition table.
func Rows(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, scope string) ([]Row, error) {
	rows, err := db.Query(ctx, `SELECT partition, owned, coalesce(moved_to, ''), coalesce(handoff_from, 0) FROM jetinbox_partitions WHERE scope = $1 ORDER BY partition`, scope)
	if err != nil {
		return nil, fmt.Errorf("shard: partition table: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var x Row
		var from int64
		err := r.Scan(&x.Partition, &x.Owned, &x.MovedTo, &from)
		x.HandOffFrom = uint64(max(from, 0))
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("shard: partition table: %w", err)
	}
	return out, nil
}

// Unfence gives partition p back to the source of a move that stopped
// after its fence: src's row of p is set owned again, if it says p was
// given to target (or to nobody yet, target's Pool then nil) and target
// does not own p. The row is locked FOR UPDATE first, so a copy to target
// that holds it FOR SHARE ends before this looks at target, and a copy
// that starts later finds the row owned and takes nothing. It reports
// whether the row changed (false: src owned p already).
func Unfence(ctx context.Context, m *Map, p int, src, target Side) (bool, error) {
	return UnfenceWith(ctx, m, p, src, target, MoveOptions{})
}

// UnfenceWith is [Unfence] with options: with [Map.ShardDurables] (o.JS
// set), the partition's hand-off durable, which holds what src acked
// unapplied since the fence, is given to src first, whose runner then
// reads it.
func UnfenceWith(ctx context.Context, m *Map, p int, src, target Side, o MoveOptions) (bool, error) {
	if m.ShardDurables && o.JS == nil {
		return false, errors.New("shard: the map has shard_durables: giving a partition back needs JetStream for its hand-off durable")
	}
	tx, err := src.Pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("shard: source %s: %w", src.Name, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if err := moveSettings(ctx, tx); err != nil {
		return false, fmt.Errorf("shard: source %s: %w", src.Name, err)
	}
	var (
		owned   bool
		movedTo *string
	)
	err = tx.QueryRow(ctx, `SELECT owned, moved_to FROM jetinbox_partitions WHERE scope = $1 AND partition = $2 FOR UPDATE`, m.Scope, p).Scan(&owned, &movedTo)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("shard: %s never owned partition %d (its table has no row for it): nothing to give back", src.Name, p)
	}
	if err != nil {
		return false, fmt.Errorf("shard: source %s: %w", src.Name, err)
	}
	if owned {
		return false, nil
	}
	named := ""
	if movedTo != nil {
		named = *movedTo
	}
	if named != target.Name {
		return false, fmt.Errorf("shard: %s gave partition %d to %q, not %q: run jetinbox partitions list, then again", src.Name, p, named, target.Name)
	}
	if target.Pool != nil {
		o, err := owns(ctx, target.Pool, m.Scope, p)
		if err != nil {
			return false, fmt.Errorf("shard: target %s: %w", target.Name, err)
		}
		if o {
			return false, fmt.Errorf("shard: %s owns partition %d (the move to it finished): move it from %s instead", target.Name, p, target.Name)
		}
		if err := notTakenSince(ctx, m, p, src, target); err != nil {
			return false, err
		}
	}
	if m.ShardDurables {
		if err := retargetHandOff(ctx, m, o.JS, p, src.Name); err != nil {
			return false, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE jetinbox_partitions SET owned = true, moved_to = NULL, handoff_from = NULL, changed_at = now() WHERE scope = $1 AND partition = $2`, m.Scope, p); err != nil {
		return false, fmt.Errorf("shard: give partition %d back to %s: %w", p, src.Name, err)
	}
	if err := pgwatch.Commit(ctx, tx); err != nil {
		return false, fmt.Errorf("shard: give partition %d back to %s: %w", p, src.Name, err)
	}
	return true, nil
}

// notTakenSince fails with [ErrMoveFinished] if to's row of p has a later
// epoch than from's: to took p after from gave it away, so a move from
// from to to finished already, and p may have moved on from to since.
func notTakenSince(ctx context.Context, m *Map, p int, from, to Side) error {
	epochOf := func(db *pgxpool.Pool) (int64, error) {
		var e int64
		err := db.QueryRow(ctx, `SELECT epoch FROM jetinbox_partitions WHERE scope = $1 AND partition = $2`, m.Scope, p).Scan(&e)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, nil
		}
		return e, err
	}
	fe, err := epochOf(from.Pool)
	if err != nil {
		return fmt.Errorf("shard: source %s: %w", from.Name, err)
	}
	te, err := epochOf(to.Pool)
	if err != nil {
		return fmt.Errorf("shard: target %s: %w", to.Name, err)
	}
	if te > fe {
		return fmt.Errorf("%w: %s took partition %d after %s gave it away (a move finished; run jetinbox partitions list)", ErrMoveFinished, to.Name, p, from.Name)
	}
	return nil
}

func owns(ctx context.Context, db *pgxpool.Pool, scope string, p int) (bool, error) {
	var owned bool
	err := db.QueryRow(ctx, `SELECT owned FROM jetinbox_partitions WHERE scope = $1 AND partition = $2`, scope, p).Scan(&owned)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return owned, err
}
