package shard

import (
	"context"
	"slices"
)

// RescueBacklog returns, for each running partition consumer (or, with
// [Map.ShardDurables], the shard durable's under -1 and each hand-off's)
// with advisories
// to rescue, how many max-deliveries advisories of its durable are not
// settled yet (see [jsinbox.Consumer.RescueBacklog]), and their sum. A
// consumer that is not running (starting, restarting) or whose rescue
// durable does not answer is left out; err is the first such answer's.
func (r *Runner) RescueBacklog(ctx context.Context) (byPartition map[int]uint64, total uint64, err error) {
	r.mu.Lock()
	parts := make([]int, 0, len(r.running)+len(r.handOffs)+1)
	runs := make(map[int]*partitionRun, cap(parts))
	for p, pr := range r.running {
		parts = append(parts, p)
		runs[p] = pr
	}
	// With one durable per shard: its backlog under -1, a hand-off's
	// under its partition.
	if r.main != nil {
		parts = append(parts, -1)
		runs[-1] = r.main
	}
	for p, pr := range r.handOffs {
		parts = append(parts, p)
		runs[p] = pr
	}
	r.mu.Unlock()
	slices.Sort(parts)
	byPartition = map[int]uint64{}
	for _, p := range parts {
		pr := runs[p]
		pr.mu.Lock()
		c := pr.c
		pr.mu.Unlock()
		if c == nil {
			continue
		}
		n, berr := c.RescueBacklog(ctx)
		if berr != nil {
			if err == nil {
				err = berr
			}
			continue
		}
		if n > 0 {
			byPartition[p] = n
			total += n
		}
	}
	return byPartition, total, err
}
