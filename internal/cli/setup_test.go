package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestConsumerSaysWhatToCreate: a server without the stream, and a durable
// the consumer refuses (AckNone), are configuration errors (exit 2) whose
// message says what to do, not a raw API error.
func TestConsumerSaysWhatToCreate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	dbURL := testenv.NewDatabase(t)
	if err := migrate(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
	run := func() error {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var stderr bytes.Buffer
		return Consumer(cctx, []string{"-http", ""}, env, io.Discard, &stderr)
	}
	err := run()
	if ExitCode(err) != 2 || !strings.Contains(err.Error(), "stream INTENTS not found: create it with jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{Name: \"INTENTS\"})") ||
		!strings.Contains(err.Error(), "nats stream add INTENTS --config deploy/jetstream/intents-stream.json") {
		t.Fatalf("no stream: exit %d, err %v", ExitCode(err), err)
	}

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{Name: "INTENTS", Subjects: []string{"intents.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, "INTENTS", jetstream.ConsumerConfig{Durable: "ledger", AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	err = run()
	if ExitCode(err) != 2 || !strings.Contains(err.Error(), "nats consumer rm INTENTS ledger") {
		t.Fatalf("AckNone durable: exit %d, err %v", ExitCode(err), err)
	}
}
