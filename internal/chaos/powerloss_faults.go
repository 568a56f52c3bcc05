// The power-loss run's rows that are not a plain power cut: one node loses
// power while another is cut off from the stream leader, and a store file
// damaged while its node is down.

package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/powerfs"
)

// cutPartitioned cuts the routes between another node and the stream
// leader, lets the publishing go on a moment, then takes the power from
// node; once node is back the routes heal.
func (s *powerStack) cutPartitioned(ctx context.Context, node int, seed uint64) (string, error) {
	t0 := time.Now()
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	l, err := s.nats.WaitStreamLeader(lctx, jsinbox.DefaultStream)
	cancel()
	if err != nil {
		return "", err
	}
	// A node that is neither the one to lose power nor the leader (when
	// the leader is the one, either of the other two).
	other := -1
	for i := range s.spec.Nodes {
		if i != node && i != l {
			other = i
			break
		}
	}
	if other < 0 {
		return "", fmt.Errorf("no node besides n%d and n%d (leader) to cut off", node+1, l+1)
	}
	s.nats.CutLink(other, l)
	time.Sleep(300 * time.Millisecond) // the publishing meets the partition first
	if err := s.nats.Kill(node); err != nil {
		return "", err
	}
	m := nodeMount(node)
	st, err := s.mounts[m].Crash(powerfs.CrashOptions{Tear: s.o.Tear, Seed: int64(seed)})
	if err != nil {
		return "", fmt.Errorf("crash %s: %w", m, err)
	}
	if err := s.nats.Start(node); err != nil {
		return "", fmt.Errorf("restart n%d: %w", node+1, err)
	}
	time.Sleep(time.Second) // back, with the other node still cut off
	if err := s.nats.HealLink(other, l); err != nil {
		return "", err
	}
	if err := s.waitHealthy(ctx); err != nil {
		return "", err
	}
	return fmt.Sprintf("n%d cut off from n%d (stream leader); n%d lost power (%s: %s); healed, back after %.1fs",
		other+1, l+1, node+1, m, st, time.Since(t0).Seconds()), nil
}

// damage kills node, damages its newest .blk file of the intents stream
// while it is down (truncated to half on odd turns, eight bits flipped in
// its second half on even ones), starts it again on it and waits until
// the cluster is healthy. It says what the node's replica held before and
// after, and what the server logged about the damage.
func (s *powerStack) damage(ctx context.Context, node int, seed uint64) (string, error) {
	t0 := time.Now()
	stream := jsinbox.DefaultStream
	bMsgs, _, bLast, _ := s.nats.StreamState(node, stream)
	if err := s.nats.Kill(node); err != nil {
		return "", err
	}
	s.damages++
	blk, err := newestBlock(s.mounts[nodeMount(node)].Dir(), stream)
	if err != nil {
		return "", err
	}
	what, err := damageBlock(blk, s.damages%2 == 1, seed)
	if err != nil {
		return "", err
	}
	s.say("n%d down: %s", node+1, what)
	if err := s.nats.Start(node); err != nil {
		return "", fmt.Errorf("n%d after the damage: %w", node+1, err)
	}
	if err := s.waitHealthy(ctx); err != nil {
		return "", fmt.Errorf("n%d after the damage: %w", node+1, err)
	}
	aMsgs, _, aLast, _ := s.nats.StreamState(node, stream)
	logged := "the server logged no warning since its start"
	if said := startWarnings(s.nats.Log(node), 2); len(said) > 0 {
		logged = "the server warned: " + strings.Join(said, " | ")
	}
	return fmt.Sprintf("n%d killed, %s; n%d's replica before %d msgs (last seq %d), healthy after %.1fs with %d msgs (last seq %d); %s",
		node+1, what, node+1, bMsgs, bLast, time.Since(t0).Seconds(), aMsgs, aLast, logged), nil
}

// newestBlock is the stream's message block with the highest index under
// a node's store directory that holds any bytes.
func newestBlock(store, stream string) (string, error) {
	files, err := filepath.Glob(filepath.Join(store, "jetstream", "*", "streams", stream, "msgs", "*.blk"))
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	index := func(p string) int {
		n, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(p), ".blk"))
		return n
	}
	slices.SortFunc(files, func(a, b string) int { return index(b) - index(a) })
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.Size() > 0 {
			return f, nil
		}
	}
	return "", fmt.Errorf("chaos: no message block of stream %s with data under %s (%d files)", stream, store, len(files))
}

// damageBlock truncates the file to half its size, or flips eight seeded
// bits in its second half, and syncs it. It says what it did.
func damageBlock(path string, truncate bool, seed uint64) (string, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	size := fi.Size()
	var what string
	if truncate {
		if err := f.Truncate(size / 2); err != nil {
			return "", fmt.Errorf("chaos: %w", err)
		}
		what = fmt.Sprintf("%s truncated from %d to %d bytes", filepath.Base(path), size, size/2)
	} else {
		dice := rand.New(rand.NewPCG(seed, 7549))
		var at []string
		for range 8 {
			off := size/2 + dice.Int64N(max(size-size/2, 1))
			b := make([]byte, 1)
			if _, err := f.ReadAt(b, off); err != nil {
				return "", fmt.Errorf("chaos: %w", err)
			}
			b[0] ^= 1 << dice.UintN(8)
			if _, err := f.WriteAt(b, off); err != nil {
				return "", fmt.Errorf("chaos: %w", err)
			}
			at = append(at, strconv.FormatInt(off, 10))
		}
		what = fmt.Sprintf("%s (%d bytes): 8 bits flipped at offsets %s", filepath.Base(path), size, strings.Join(at, ","))
	}
	return what, errors.Join(f.Sync())
}

// startWarnings returns up to n distinct warnings and errors a server
// logged since its last start, without their time stamps.
func startWarnings(log string, n int) []string {
	lines := strings.Split(log, "\n")
	for k := len(lines) - 1; k >= 0; k-- {
		if strings.Contains(lines[k], "Starting nats-server") {
			lines = lines[k:]
			break
		}
	}
	var said []string
	for _, line := range lines {
		if !strings.Contains(line, "[WRN]") && !strings.Contains(line, "[ERR]") {
			continue
		}
		if k := max(strings.Index(line, "[WRN]"), strings.Index(line, "[ERR]")); k >= 0 {
			line = strings.Join(strings.Fields(line[k:]), " ")
		}
		if len(line) > 160 {
			line = line[:160] + "…"
		}
		if len(said) < n && !slices.Contains(said, line) {
			said = append(said, line)
		}
	}
	return said
}
