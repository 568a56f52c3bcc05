package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// streamMsgs is how many messages stream holds on srv.
func streamMsgs(t *testing.T, srv *natsenv.NATS, stream string) uint64 {
	t.Helper()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// TestProducerConflict: a JSONL line reusing an ID the stream holds with
// another payload is reported by line as a conflict and fails the run; a
// line repeating an intent exactly is a duplicate and fine. In single
// publishes, with group commit and in atomic batches of at most 10.
func TestProducerConflict(t *testing.T) {
	t.Parallel()
	for _, batch := range []string{"1", "0", "10"} {
		t.Run("batch="+batch, func(t *testing.T) {
			t.Parallel()
			srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
			input := strings.Join([]string{
				`{"id":"c-1","payload":{"account":1,"amount":5}}`,
				`{"id":"c-2","payload":{"account":2,"amount":7}}`,
				`{"id":"c-1","payload":{"account":1,  "amount":5}}`,
				`{"id":"c-2","payload":{"account":2,"amount":700}}`,
				`{"id":"c-3","payload":{"account":3,"amount":9}}`,
			}, "\n")
			var out, errOut bytes.Buffer
			err := Producer(context.Background(), []string{"-input", "-", "-batch", batch}, mapEnv(map[string]string{"NATS_URL": srv.URL()}),
				strings.NewReader(input), &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), "1 intents not published (1 reused an ID") || ExitCode(err) != 1 {
				t.Fatalf("err = %v (exit %d), want 1 conflict and exit 1\nstdout: %s\nstderr:\n%s", err, ExitCode(err), out.String(), errOut.String())
			}
			if !strings.Contains(errOut.String(), "line 4: conflict: id c-2 ") || !strings.Contains(errOut.String(), "different subject or payload") {
				t.Errorf("stderr does not report line 4 as a conflict:\n%s", errOut.String())
			}
			if !strings.Contains(out.String(), "published 4 ") || !strings.Contains(out.String(), "server-side duplicates 1  conflicts 1 ") {
				t.Errorf("summary: %s", out.String())
			}
			if n := streamMsgs(t, srv, "INTENTS"); n != 3 {
				t.Fatalf("stream holds %d messages, want 3", n)
			}
		})
	}
}

// TestProducerPinsStream: the producer publishes into its -stream. Intents
// whose subjects another stream captures (here the dead-letter stream,
// through a wrong -subject) fail the run, naming both streams, instead of
// passing for published.
func TestProducerPinsStream(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	env := mapEnv(map[string]string{"NATS_URL": srv.URL()})
	var out, errOut bytes.Buffer
	if err := Producer(context.Background(), []string{"-stream", "ORDERS", "-subject", "orders", "-count", "20"}, env, nil, &out, &errOut); err != nil {
		t.Fatalf("-stream ORDERS: %v\n%s", err, errOut.String())
	}
	if n := streamMsgs(t, srv, "ORDERS"); n != 20 {
		t.Fatalf("ORDERS holds %d messages, want 20", n)
	}

	out.Reset()
	errOut.Reset()
	err := Producer(context.Background(), []string{"-stream", "ORDERS", "-subject", "dlq.orders", "-count", "20"}, env, nil, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "20 intents not published") || ExitCode(err) != 1 {
		t.Fatalf("err = %v, want 20 intents not published\nstdout: %s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	if !strings.Contains(errOut.String(), `captured by stream "ORDERS_DLQ", not "ORDERS"`) {
		t.Errorf("stderr does not name both streams:\n%s", errOut.String())
	}
}
