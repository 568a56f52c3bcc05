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
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestStreamSizesAsSettings: the producer creates the intents and
// dead-letter streams with the sizes its flags and environment give, in
// bytes or with units; a size that does not parse is a usage error.
func TestStreamSizesAsSettings(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"16GiB": 16 << 30, "1GiB": 1 << 30, "512MiB": 512 << 20, "2GB": 2e9, "1048576": 1 << 20, "1.5KiB": 1536} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1GiB", "lots", "1XB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
	for _, args := range [][]string{{"-stream-max-bytes", "big"}, {"-stream-max-msgs", "-1"}, {"-stream-max-age", "-1h"}, {"-stream-max-msg-size", "3GiB"}} {
		err := Producer(context.Background(), args, mapEnv(nil), nil, io.Discard, io.Discard)
		if ExitCode(err) != 2 {
			t.Errorf("%v: exit %d (%v), want 2", args, ExitCode(err), err)
		}
	}
	if err := Producer(context.Background(), nil, mapEnv(map[string]string{"JETINBOX_STREAM_MAX_MSG_SIZE": "big"}), nil, io.Discard, io.Discard); ExitCode(err) != 2 {
		t.Errorf("bad JETINBOX_STREAM_MAX_MSG_SIZE: %v", err)
	}
	if err := Producer(context.Background(), nil, mapEnv(map[string]string{"JETINBOX_DLQ_MAX_BYTES": "1 lot"}), nil, io.Discard, io.Discard); ExitCode(err) != 2 {
		t.Errorf("bad JETINBOX_DLQ_MAX_BYTES: %v", err)
	}

	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	var out bytes.Buffer
	err := Producer(context.Background(), []string{"-count", "10", "-stream-max-bytes", "1GiB", "-stream-max-msgs", "1000", "-stream-max-age", "48h", "-stream-max-msg-size", "16KiB"},
		mapEnv(map[string]string{"NATS_URL": srv.URL(), "JETINBOX_DLQ_MAX_BYTES": "64MiB"}), strings.NewReader(""), &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(context.Background(), jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.MaxBytes != 1<<30 || c.MaxMsgs != 1000 || c.MaxAge != 48*time.Hour || c.MaxMsgSize != 16<<10 {
		t.Errorf("intents stream: bytes %d msgs %d age %v max_msg_size %d", c.MaxBytes, c.MaxMsgs, c.MaxAge, c.MaxMsgSize)
	}
	dlq, err := js.Stream(context.Background(), jsinbox.DeadLetterStream(jsinbox.DefaultStream))
	if err != nil {
		t.Fatal(err)
	}
	if c := dlq.CachedInfo().Config; c.MaxBytes != 64<<20 || c.MaxMsgSize != 16<<10+jsinbox.DeadLetterHeadroom {
		t.Errorf("dead-letter stream MaxBytes %d, max_msg_size %d; want 64MiB and room for the largest intent's dead letter", c.MaxBytes, c.MaxMsgSize)
	}
}
