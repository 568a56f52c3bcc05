package pginbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
)

// TestPruneBoundaries: OlderThan must be strictly longer than the replay
// horizon plus the margin; at the boundary nothing is deleted. The cut-off
// is PostgreSQL's now() minus OlderThan, the clock received_at comes from.
func TestPruneBoundaries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newDB(t)
	const horizon = 48 * time.Hour
	// Rows received, by PostgreSQL's clock, 2 s past and 60 s short of each
	// cut-off tried below, in two scopes.
	if _, err := pool.Exec(ctx, `INSERT INTO inbox (scope, message_id, fingerprint, received_at)
SELECT s, s || '-' || n, '\x00'::bytea, now() - (n || ' seconds')::interval
FROM unnest(ARRAY['a', 'b']) AS s, unnest(ARRAY[
	49*3600 + 2, 49*3600 - 60,     -- around horizon + 1h margin + 1µs
	51*3600 + 2, 51*3600 - 60      -- around horizon + 3h
]) AS n`); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, o := range []inbox.PruneOptions{
		{OlderThan: horizon, ReplayHorizon: horizon},
		{OlderThan: horizon + time.Minute, ReplayHorizon: horizon},
		{OlderThan: horizon + inbox.DefaultPruneMargin, ReplayHorizon: horizon},
		{OlderThan: horizon + 3*time.Hour, ReplayHorizon: horizon, Margin: 3 * time.Hour},
	} {
		if n, err := pginbox.New(pool).Prune(ctx, o); !errors.Is(err, inbox.ErrUnsafeHorizon) || n != 0 {
			t.Fatalf("OlderThan %v, horizon %v, margin %v: pruned %d, %v; want ErrUnsafeHorizon", o.OlderThan, o.ReplayHorizon, o.Margin, n, err)
		}
	}
	if n := count(); n != 8 {
		t.Fatalf("refused prunes deleted rows: %d left, want 8", n)
	}
	// One microsecond past the boundary, one scope: only that scope's row
	// older than the cut-off goes.
	n, err := pginbox.New(pool).Prune(ctx, inbox.PruneOptions{Scope: "a", OlderThan: horizon + inbox.DefaultPruneMargin + time.Microsecond, ReplayHorizon: horizon})
	if err != nil || n != 3 {
		t.Fatalf("prune past the boundary: %d, %v; want 3 rows of scope a (everything older than 49h)", n, err)
	}
	n, err = pginbox.New(pool).Prune(ctx, inbox.PruneOptions{OlderThan: horizon + 3*time.Hour + time.Microsecond, ReplayHorizon: horizon, Margin: 3 * time.Hour, BatchSize: 1})
	if err != nil || n != 1 {
		t.Fatalf("prune with a 3h margin: %d, %v; want the one row of scope b older than 51h", n, err)
	}
	var left []string
	rows, err := pool.Query(ctx, `SELECT message_id FROM inbox ORDER BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if got, want := len(left), 4; got != want || left[0] != "a-176340" || left[1] != "b-176340" || left[2] != "b-176402" || left[3] != "b-183540" {
		t.Fatalf("rows left: %v", left)
	}
}
