package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestProducerShards: producer -shards creates the partitioned stream with
// its transform and publishes each intent on its ID's key, so that every
// stored message passes the consumers' binding check; a retry (same ID,
// same payload) is a duplicate, read back under the subject the transform
// stored, not a conflict; a -stream or -subject the map contradicts is a
// usage error.
func TestProducerShards(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	env := mapEnv(map[string]string{"NATS_URL": srv.URL()})
	mapFile := filepath.Join(t.TempDir(), "shards.json")
	if err := os.WriteFile(mapFile, []byte(`{"stream": "PSHARDS", "subject": "ps", "partitions": 8, "scope": "ledger", "durable_prefix": "ledger",
  "shards": [{"name": "a", "database_url": "postgres://a/x", "partitions": "0-3"}, {"name": "b", "database_url": "postgres://b/x", "partitions": "4-7"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := shard.Load(mapFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var out, errOut bytes.Buffer
	if err := Producer(ctx, []string{"-shards", mapFile, "-count", "40", "-prefix", "sh"}, env, nil, &out, &errOut); err != nil {
		t.Fatalf("producer -shards: %v\n%s%s", err, out.String(), errOut.String())
	}
	line := `{"id":"jl-1","subject":"ps.ledger.2","payload":{"account":2,"amount":5}}` + "\n"
	out.Reset()
	if err := Producer(ctx, []string{"-shards", mapFile, "-input", "-", "-batch", "1"}, env, strings.NewReader(line+line), &out, &errOut); err != nil {
		t.Fatalf("producer -shards -input: %v\n%s%s", err, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "published 2 ") || !strings.Contains(out.String(), "server-side duplicates 1") || !strings.Contains(out.String(), "conflicts 0") {
		t.Fatalf("a retry on the partitioned stream: %s", out.String())
	}

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(ctx, m.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CheckStream(s.CachedInfo().Config); err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 41 {
		t.Fatalf("%s holds %d messages, want 41", m.Stream, n)
	}
	for seq := uint64(1); seq <= 41; seq++ {
		raw, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := shard.Check(m.Subject, m.Partitions, raw.Header.Get(jetstream.MsgIDHeader), raw.Subject); err != nil {
			t.Errorf("sequence %d: %v", seq, err)
		}
	}
	if raw, _ := s.GetMsg(ctx, 41); raw == nil || !strings.HasSuffix(raw.Subject, "."+shard.Key("jl-1")+".ledger.2") {
		t.Errorf("the JSONL line's kind was not kept: %+v", raw)
	}

	for _, args := range [][]string{
		{"-shards", mapFile, "-stream", "INTENTS"},
		{"-shards", mapFile, "-subject", "intents"},
		{"-shards", filepath.Join(t.TempDir(), "missing.json")},
	} {
		err := Producer(ctx, append(args, "-count", "0"), env, nil, &out, &errOut)
		var ue UsageError
		if !errors.As(err, &ue) {
			t.Errorf("producer %v: %v, want a usage error", args, err)
		}
	}
}
