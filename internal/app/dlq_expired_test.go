package app

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
)

// TestDLQExpiredNotRedriven: an expired record (a message the server gave
// up on that aged out of the stream before its rescue) is listed with its
// status, and a re-drive says plainly why it cannot re-drive it: nothing
// of the intent is kept. Nothing is published. jetinbox verify reports it
// as a violation and exits 1.
func TestDLQExpiredNotRedriven(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pipelinetest.Start(t)
	env, js := mapEnv(map[string]string{"NATS_URL": e.NATS.URL(), "DATABASE_URL": e.DBURL}), e.JS
	if err := pipeline.Setup(ctx, js, e.Pool, jsinbox.StreamConfig{}, 10); err != nil {
		t.Fatal(err)
	}
	// As the rescue records one.
	rec := &nats.Msg{Subject: jsinbox.DeadLetterPrefix + "intents._expired_", Header: nats.Header{
		jsinbox.HeaderStatus: {jsinbox.DeadLetterExpired}, jsinbox.HeaderReason: {"given up on after 20 deliveries, then aged out"},
		jsinbox.HeaderScope: {"ledger"}, jsinbox.HeaderStream: {jsinbox.DefaultStream}, jsinbox.HeaderStreamSeq: {"7"},
		jsinbox.HeaderDelivered: {"20"}}}
	if _, err := js.PublishMsg(ctx, rec, jetstream.WithMsgID("ledger:"+jsinbox.DefaultStream+":7"),
		jetstream.WithExpectStream(jsinbox.DeadLetterStream(jsinbox.DefaultStream))); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := Jetinbox(ctx, append([]string{"dlq"}, args...), env, nil, &out, io.Discard); err != nil {
			t.Fatalf("dlq %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	if out := run(); !strings.Contains(out, "expired") {
		t.Fatalf("dlq lists no expired record:\n%s", out)
	}
	out := run("-redrive", "-all")
	if !strings.Contains(out, "stream seq 7 expired before rescue") || !strings.Contains(out, "nothing is kept to re-drive") ||
		!strings.Contains(out, "re-driven 0") {
		t.Fatalf("dlq -redrive of an expired record:\n%s", out)
	}
	// jetinbox verify counts it as a violation: exit 1.
	var rep bytes.Buffer
	err := Jetinbox(ctx, []string{"verify"}, env, nil, &rep, io.Discard)
	if cli.ExitCode(err) != 1 || !strings.Contains(rep.String(), "expired before rescue  1  VIOLATION") {
		t.Fatalf("jetinbox verify with an expired record: %v (exit %d)\n%s", err, cli.ExitCode(err), rep.String())
	}
	s, err := js.Stream(ctx, jsinbox.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("the re-drive published %d messages", n)
	}
}
