package shard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestAccountMappingPartitionsLikeTheStream holds what a stream per
// partition would rest on: an account's subject mapping with the stream
// transform's destination puts every publish on the subject the sharded
// stream's transform stores it under (so Partition, Check and the durables'
// filters stay as they are), and a stream capturing one partition's
// subjects then holds exactly that partition's messages, deduplicated as
// before (an ID always maps to the same partition, so to the same stream).
func TestAccountMappingPartitionsLikeTheStream(t *testing.T) {
	const parts = 7
	n := natsenv.NewNATS(t, natsenv.NATSOptions{})
	m := (&Map{Subject: "pm", Partitions: parts}).WithDefaults()
	src, dest := m.SubjectTransform()
	if err := n.Server().GlobalAccount().AddMapping(src, dest); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for p := range parts {
		cfg := jsinbox.StreamConfig{Name: fmt.Sprintf("PM%d", p), Subjects: []string{m.Filter(p)}, MaxBytes: 64 << 20}.Config()
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int{}
	for i := range 200 {
		id := fmt.Sprintf("id-%d", i)
		for range 2 { // the second is a duplicate
			ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: PublishSubject(m.Subject, id, "ledger.7"), Data: []byte("{}"), Header: nats.Header{jetstream.MsgIDHeader: {id}}})
			if err != nil {
				t.Fatal(err)
			}
			if stream := fmt.Sprintf("PM%d", PartitionOf(id, parts)); ack.Stream != stream {
				t.Fatalf("ID %q stored in %s, want %s (its partition)", id, ack.Stream, stream)
			}
		}
		want[fmt.Sprintf("PM%d", PartitionOf(id, parts))]++
	}
	for p := range parts {
		name := fmt.Sprintf("PM%d", p)
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().State.Msgs; got != uint64(want[name]) {
			t.Errorf("stream %s holds %d messages, want %d (one per ID of its partition)", name, got, want[name])
		}
		for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
			raw, err := s.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			id := raw.Header.Get(jetstream.MsgIDHeader)
			if got, err := Check(m.Subject, parts, id, raw.Subject); err != nil || got != p {
				t.Fatalf("stream %s, %q stored on %q: partition %d, %v", name, id, raw.Subject, got, err)
			}
		}
	}
}
