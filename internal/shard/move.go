package shard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// Move takes partition p from the shard whose database is from and gives
// it to the shard whose database is to, while both run:
//
//  1. fence: in from, the partition's row is set not owned. The UPDATE
//     waits for the batches applying p to commit (they hold the row FOR
//     SHARE); once it commits no transaction there applies p, and from's
//     runner stops p's consumer within its poll (what it still holds is
//     nak'd);
//  2. copy: in one transaction in to, every inbox row of the scope whose
//     ID is in p is copied from from (keeping its status, fingerprint,
//     subject and time; a row to kept from an earlier time it owned p
//     gives way to from's, the later), and the partition's row set owned;
//  3. to's runner starts p's durable, which carries on where from left
//     off: what from applied but did not ack comes back to to as a
//     duplicate of a copied row.
//
// Messages of p wait in their durable between 1 and 3; no other partition
// stops. A move that failed halfway can be run again: it finishes.
func Move(ctx context.Context, m *Map, p int, from, to *pgxpool.Pool) (MoveResult, error) {
	res := MoveResult{Partition: p}
	if p < 0 || p >= m.Partitions {
		return res, fmt.Errorf("shard: partition %d out of range 0-%d", p, m.Partitions-1)
	}
	toOwns, err := owns(ctx, to, m.Scope, p)
	if err != nil {
		return res, fmt.Errorf("shard: target: %w", err)
	}
	if toOwns {
		res.Already = true
		return res, nil
	}
	// 1. The fence.
	tx, err := from.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("shard: source: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+moveLockTimeout+"'"); err != nil {
		return res, fmt.Errorf("shard: source: %w", err)
	}
	tag, err := tx.Exec(ctx, `UPDATE jetinbox_partitions SET owned = false, changed_at = now() WHERE scope = $1 AND partition = $2 AND owned`, m.Scope, p)
	if err != nil {
		return res, fmt.Errorf("shard: fence partition %d in the source: %w", p, err)
	}
	if tag.RowsAffected() == 0 {
		// Not owned there: an earlier move fenced it and stopped. Moving
		// it from a shard that never had it would copy nothing and could
		// leave it owned twice, so insist on a row saying it was given away.
		var given bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM jetinbox_partitions WHERE scope = $1 AND partition = $2 AND NOT owned)`, m.Scope, p).Scan(&given); err != nil {
			return res, fmt.Errorf("shard: source: %w", err)
		}
		if !given {
			return res, fmt.Errorf("shard: the source never owned partition %d (its table has no row for it): check the map and run jetinbox partitions list", p)
		}
		res.Resumed = true
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("shard: fence partition %d in the source: %w", p, err)
	}
	// 2. Copy the partition's inbox rows and take it, in one transaction.
	n, err := copyRows(ctx, m, p, from, to)
	res.Copied = n
	return res, err
}

func owns(ctx context.Context, db *pgxpool.Pool, scope string, p int) (bool, error) {
	var owned bool
	err := db.QueryRow(ctx, `SELECT owned FROM jetinbox_partitions WHERE scope = $1 AND partition = $2`, scope, p).Scan(&owned)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return owned, err
}

// copyChunk is how many rows go to the target per statement.
const copyChunk = 5000

func copyRows(ctx context.Context, m *Map, p int, from, to *pgxpool.Pool) (int64, error) {
	tx, err := to.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("shard: target: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	rows, err := from.Query(ctx, `SELECT message_id, fingerprint, status, reason, stream_seq, subject, received_at FROM inbox WHERE scope = $1`, m.Scope)
	if err != nil {
		return 0, fmt.Errorf("shard: read the source's inbox: %w", err)
	}
	defer rows.Close()
	var (
		ids, statuses, subjects []string
		reasons                 []*string
		fps                     [][]byte
		seqs                    []int64
		ats                     []time.Time
		copied                  int64
	)
	flush := func() error {
		if len(ids) == 0 {
			return nil
		}
		tag, err := tx.Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint, status, reason, stream_seq, subject, received_at)
SELECT $1, * FROM unnest($2::text[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::timestamptz[])
ON CONFLICT (scope, message_id) DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status, reason = excluded.reason,
	stream_seq = excluded.stream_seq, subject = excluded.subject, received_at = excluded.received_at`, m.Scope, ids, fps, statuses, reasons, seqs, subjects, ats)
		if err != nil {
			return fmt.Errorf("shard: copy inbox rows to the target: %w", err)
		}
		copied += tag.RowsAffected()
		ids, fps, statuses, reasons, seqs, subjects, ats = ids[:0], fps[:0], statuses[:0], reasons[:0], seqs[:0], subjects[:0], ats[:0]
		return nil
	}
	for rows.Next() {
		var (
			id, status, subject string
			reason              *string
			fp                  []byte
			seq                 int64
			at                  time.Time
		)
		if err := rows.Scan(&id, &fp, &status, &reason, &seq, &subject, &at); err != nil {
			return copied, fmt.Errorf("shard: read the source's inbox: %w", err)
		}
		if PartitionOf(id, m.Partitions) != p {
			continue
		}
		ids, fps, statuses, reasons, seqs, subjects, ats = append(ids, id), append(fps, fp), append(statuses, status), append(reasons, reason), append(seqs, seq), append(subjects, subject), append(ats, at)
		if len(ids) >= copyChunk {
			if err := flush(); err != nil {
				return copied, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return copied, fmt.Errorf("shard: read the source's inbox: %w", err)
	}
	if err := flush(); err != nil {
		return copied, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO jetinbox_partitions (scope, partition, owned) VALUES ($1, $2, true)
ON CONFLICT (scope, partition) DO UPDATE SET owned = true, changed_at = now()`, m.Scope, p); err != nil {
		return copied, fmt.Errorf("shard: take partition %d in the target: %w", p, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return copied, fmt.Errorf("shard: take partition %d in the target: %w", p, err)
	}
	return copied, nil
}
