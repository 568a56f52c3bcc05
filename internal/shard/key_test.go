package shard

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestPartitionMatchesServer publishes IDs through a real server's
// transform and holds Partition to the partition token it stored: the
// consumers' check is only as good as this copy of the server's function.
func TestPartitionMatchesServer(t *testing.T) {
	n := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	for _, parts := range []int{64, 7} {
		m := (&Map{Stream: fmt.Sprintf("P%d", parts), Subject: fmt.Sprintf("p%d", parts), Partitions: parts}).WithDefaults()
		if err := m.EnsureStream(ctx, js, jsinbox.StreamConfig{}); err != nil {
			t.Fatal(err)
		}
		ids := []string{"a", "order-1", "ship-42", "x y z", "ünïcödé", "with.dots.in.it", strings.Repeat("L", 200)}
		for i := range 300 {
			ids = append(ids, fmt.Sprintf("id-%d", i))
		}
		seen := map[int]bool{}
		for _, id := range ids {
			ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: PublishSubject(m.Subject, id, "ledger.7"), Data: []byte("{}"), Header: nats.Header{jetstream.MsgIDHeader: {id}}})
			if err != nil {
				t.Fatal(err)
			}
			raw, err := js.Conn().Request("$JS.API.DIRECT.GET."+m.Stream, []byte(fmt.Sprintf(`{"seq":%d}`, ack.Sequence)), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			stored := raw.Header.Get("Nats-Subject")
			if want := StoredSubject(m.Subject, id, "ledger.7", parts); stored != want {
				t.Fatalf("%d partitions, ID %q: server stored %q, Partition says %q", parts, id, stored, want)
			}
			p, err := Check(m.Subject, parts, id, stored)
			if err != nil {
				t.Fatalf("binding of a message the server stored: %v", err)
			}
			seen[p] = true
		}
		if len(seen) < parts*3/4 {
			t.Errorf("%d partitions: only %d used by %d IDs", parts, len(seen), len(ids))
		}
	}
}

func TestCheckRefuses(t *testing.T) {
	id := "order-1"
	good := StoredSubject("p", id, "ledger.1", 64)
	if _, err := Check("p", 64, id, good); err != nil {
		t.Fatal(err)
	}
	k := Key(id)
	other := (Partition(k, 64) + 1) % 64
	for name, subj := range map[string]string{
		"another ID's key":    StoredSubject("p", "order-2", "ledger.1", 64),
		"wrong partition":     fmt.Sprintf("p.%d.%s.ledger.1", other, k),
		"no kind":             fmt.Sprintf("p.%d.%s", Partition(k, 64), k),
		"re-published stored": StoredSubject("p", id, "x", 64)[:2] + "5." + good[2:],
		"not a number":        "p.x1." + k + ".ledger",
		"leading zero":        fmt.Sprintf("p.0%d.%s.ledger", Partition(k, 64), k),
		"other prefix":        "q.1." + k + ".ledger",
	} {
		if _, err := Check("p", 64, id, subj); err == nil {
			t.Errorf("%s: %q passed the binding check", name, subj)
		}
	}
	if u, _ := Unstored("p", good); u != PublishSubject("p", id, "ledger.1") {
		t.Errorf("Unstored(%q) = %q", good, u)
	}
}

func TestSet(t *testing.T) {
	s, err := ParseSet("40, 0-3,2,7-7")
	if err != nil || s.String() != "0-3,7,40" {
		t.Fatalf("%v %v", s, err)
	}
	for _, bad := range []string{"x", "3-1", "-1", "1-"} {
		if _, err := ParseSet(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestPartitionIsFNV1a holds the allocation-free hash to hash/fnv's.
func TestPartitionIsFNV1a(t *testing.T) {
	for i := range 1000 {
		k := Key(fmt.Sprint("id-", i))
		h := fnv.New32a()
		_, _ = h.Write([]byte(k))
		if got, want := Partition(k, 64), int(h.Sum32()%64); got != want {
			t.Fatalf("%s: %d, fnv says %d", k, got, want)
		}
	}
}

// BenchmarkCheck is the binding check's cost per message.
func BenchmarkCheck(b *testing.B) {
	id := "order-2026-12-01-000042"
	subj := StoredSubject("pintents", id, "ledger.7", 64)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Check("pintents", 64, id, subj); err != nil {
			b.Fatal(err)
		}
	}
}
