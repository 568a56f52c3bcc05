// The cluster run's faults that close nothing or change who is in the
// cluster: a black-holed stream leader, a one-way cut, a server removed
// from the cluster, and a removal while the leader is cut off.

package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// blackHoleLeader drops every byte to and from the stream leader, on its
// routes and its client links, without closing anything: it keeps running
// and keeps its connections, and learns of the fault only from missing
// Raft heartbeats; its clients' writes succeed and get no answer. The
// other two elect a leader; the hole stays a while, then heals (the links
// it touched are reset and dialed again).
func (r *clusterRun) blackHoleLeader(ctx context.Context) (string, error) {
	l, err := r.cl.WaitStreamLeader(ctx, r.stream)
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	if err := r.cl.BlackHole(l); err != nil {
		return "", err
	}
	r.say("  black-holed %s (stream leader): routes and client links drop every byte, nothing closed", r.cl.Name(l))
	nl, err := r.waitNewLeader(ctx, l, func() int { return r.cl.StreamLeader(r.stream) })
	if err != nil {
		_ = r.cl.Heal(l)
		return "", err
	}
	elected := time.Since(t0)
	time.Sleep(2 * time.Second) // the majority works on while the hole lasts
	if err := r.cl.Heal(l); err != nil {
		return "", err
	}
	r.say("  healed %s after %.1fs", r.cl.Name(l), time.Since(t0).Seconds())
	return fmt.Sprintf("%s (stream leader) black-holed %.1fs; %s elected after %.1fs; healed", r.cl.Name(l), time.Since(t0).Seconds(), r.cl.Name(nl), elected.Seconds()), nil
}

// oneWayCut makes a stream follower deaf to the leader while the leader
// still hears it (and the third node hears both): the follower misses
// heartbeats and calls elections the others can hear. It lasts past
// several election timeouts, then heals.
func (r *clusterRun) oneWayCut(ctx context.Context) (string, error) {
	l, err := r.cl.WaitStreamLeader(ctx, r.stream)
	if err != nil {
		return "", err
	}
	var f = -1
	for _, p := range r.cl.StreamPeers(r.stream) {
		if p != l {
			f = p
			break
		}
	}
	if f < 0 {
		return "", fmt.Errorf("stream %s has no follower under %s", r.stream, r.cl.Name(l))
	}
	t0 := time.Now()
	r.cl.CutOneWay(l, f)
	r.say("  %s (a follower) no longer hears %s (the stream leader); %s still hears %s", r.cl.Name(f), r.cl.Name(l), r.cl.Name(l), r.cl.Name(f))
	leaders := []string{r.cl.Name(l)}
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; {
		if x := r.cl.StreamLeader(r.stream); x >= 0 && r.cl.Name(x) != leaders[len(leaders)-1] {
			leaders = append(leaders, r.cl.Name(x))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := r.cl.HealLink(l, f); err != nil {
		return "", err
	}
	r.say("  healed the routes between %s and %s after %.1fs; stream leaders seen: %v", r.cl.Name(l), r.cl.Name(f), time.Since(t0).Seconds(), leaders)
	return fmt.Sprintf("%s deaf to %s (leader) for %.1fs, not the reverse; stream leaders seen %v; healed", r.cl.Name(f), r.cl.Name(l), time.Since(t0).Seconds(), leaders), nil
}

// removeServer asks, until it succeeds, that node i leave the cluster,
// through any node that runs and is not cut off; it gives up after limit.
func (r *clusterRun) removeServer(ctx context.Context, i int, limit time.Duration) error {
	var last error
	for deadline := time.Now().Add(limit); time.Now().Before(deadline) && ctx.Err() == nil; {
		for _, via := range r.answeringExcept(i) {
			rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			last = r.cl.RemoveServer(rctx, via, i)
			cancel()
			// An earlier request whose answer timed out may have gone
			// through.
			if last != nil && strings.Contains(last.Error(), "not a member") {
				last = nil
			}
			if last == nil {
				r.removed[i] = true
				return nil
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	if last == nil {
		last = ctx.Err()
	}
	return fmt.Errorf("remove server %s: %w", r.cl.Name(i), last)
}

// answeringExcept lists the running nodes other than i, not removed.
func (r *clusterRun) answeringExcept(i int) []int {
	var is []int
	for j := range r.cl.Size() {
		if j != i && !r.removed[j] && r.cl.Running(j) {
			is = append(is, j)
		}
	}
	return is
}

// replaced waits until the stream sits on three peers, gone not among
// them, fresh among them (if not -1), every replica current.
func (r *clusterRun) replaced(ctx context.Context, gone, fresh int) ([]int, error) {
	var now []int
	err := pollUntil(ctx, func() bool {
		now = r.cl.StreamPeers(r.stream)
		return len(now) == 3 && !slices.Contains(now, gone) && (fresh < 0 || slices.Contains(now, fresh))
	})
	if err != nil {
		return nil, fmt.Errorf("stream peers %v after removing %s (fresh %s): %w", r.peerNames(now), r.cl.Name(gone), r.cl.Name(fresh), err)
	}
	return now, r.cl.WaitStreamCurrent(ctx, r.stream)
}

// serverRemove: a fresh server joined before the phase (r.fresh); a
// stream follower is shut down and removed from the cluster
// ($JS.API.SERVER.REMOVE), as an operator retires a machine; the meta
// leader places its replicas (the stream's and the durable's) on the
// fresh server, which catches up. The removed server stays down.
func (r *clusterRun) serverRemove(ctx context.Context) (string, error) {
	l, err := r.cl.WaitStreamLeader(ctx, r.stream)
	if err != nil {
		return "", err
	}
	victim := -1
	for _, p := range r.cl.StreamPeers(r.stream) {
		if p != l {
			victim = p
			break
		}
	}
	if victim < 0 {
		return "", fmt.Errorf("stream %s has no follower under %s", r.stream, r.cl.Name(l))
	}
	t0 := time.Now()
	if err := r.cl.Stop(victim); err != nil {
		return "", err
	}
	if err := r.removeServer(ctx, victim, time.Minute); err != nil {
		return "", err
	}
	r.say("  stopped %s and removed it from the cluster", r.cl.Name(victim))
	now, err := r.replaced(ctx, victim, r.fresh)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s joined; %s stopped and removed from the cluster; peers %v current after %.1fs", r.cl.Name(r.fresh), r.cl.Name(victim), r.peerNames(now), time.Since(t0).Seconds()), nil
}

// membershipPartition is the membership change meeting a partition, as
// the public analysis of NATS 2.12.1 did it (a node cut off, nodes killed,
// a server removed, in quick succession), on a meta group of five (fresh
// servers joined before the phase until five run):
// the stream leader is cut off, a stream follower is killed (SIGKILL) and
// removed from the cluster while the leader is still cut off, then the
// leader is healed. The removal goes through only while the nodes left
// make a quorum of the meta group; else it is asked again after the heal,
// and the note says so.
func (r *clusterRun) membershipPartition(ctx context.Context) (string, error) {
	l, err := r.cl.WaitStreamLeader(ctx, r.stream)
	if err != nil {
		return "", err
	}
	victim := -1
	for _, p := range r.cl.StreamPeers(r.stream) {
		if p != l {
			victim = p
			break
		}
	}
	if victim < 0 {
		return "", fmt.Errorf("stream %s has no follower under %s", r.stream, r.cl.Name(l))
	}
	t0 := time.Now()
	r.cl.Partition(l)
	if err := r.cl.Kill(victim); err != nil {
		return "", err
	}
	r.say("  partitioned %s (stream leader) and killed %s (a follower)", r.cl.Name(l), r.cl.Name(victim))
	when := "while " + r.cl.Name(l) + " was cut off"
	if err := r.removeServer(ctx, victim, 15*time.Second); err != nil {
		r.say("  no removal while cut off (%v); healing first", err)
		when = "after the heal (the nodes left made no meta quorum)"
	}
	time.Sleep(time.Second)
	if err := r.cl.Heal(l); err != nil {
		return "", err
	}
	r.say("  healed %s", r.cl.Name(l))
	if !r.removed[victim] {
		if err := r.removeServer(ctx, victim, time.Minute); err != nil {
			return "", err
		}
	}
	r.say("  removed %s from the cluster %s", r.cl.Name(victim), when)
	now, err := r.replaced(ctx, victim, -1)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s joined (a meta group of five); %s (leader) cut off, %s killed and removed from the cluster %s; peers %v current after %.1fs",
		strings.Join(r.peerNames(r.joined), ", "), r.cl.Name(l), r.cl.Name(victim), when, r.peerNames(now), time.Since(t0).Seconds()), nil
}
