package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestProducerWarnsOnlyAboutItself: the producer's config warnings are about
// its retries against the duplicate window of the stream as it exists, and
// never about consumer settings such as MaxDeliver.
func TestProducerWarnsOnlyAboutItself(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	env := mapEnv(map[string]string{"NATS_URL": srv.URL()})
	// The defaults fit the default window: no warning at all.
	fresh := mapEnv(map[string]string{"NATS_URL": natsenv.NewNATS(t, natsenv.NATSOptions{}).URL()})
	var errOut bytes.Buffer
	if err := Producer(context.Background(), []string{"-count", "3", "-log-format", "text"}, fresh, nil, io.Discard, &errOut); err != nil ||
		strings.Contains(errOut.String(), "WARN") {
		t.Errorf("the producer's defaults: %v\n%s", err, errOut.String())
	}
	produce := func(args ...string) string {
		t.Helper()
		var errOut bytes.Buffer
		if err := Producer(context.Background(), append([]string{"-count", "3", "-log-format", "text"}, args...), env, nil, io.Discard, &errOut); err != nil {
			t.Fatalf("%v\n%s", err, errOut.String())
		}
		if strings.Contains(errOut.String(), "MaxDeliver") {
			t.Errorf("the producer warns about a consumer setting:\n%s", errOut.String())
		}
		return errOut.String()
	}

	// A stream created with a 10-minute window keeps it when a producer
	// asking for the default 2 minutes comes along: 20 retries of up to
	// 10 s with a 5 s PubAck timeout each (4m32s) fit in it.
	produce("-duplicate-window", "10m")
	if got := produce("-retry-attempts", "20", "-retry-for", "0"); strings.Contains(got, "duplicate window") {
		t.Errorf("warned against the asked window, not the stream's 10 minutes:\n%s", got)
	}
	// 100 retries (25 minutes) do not.
	if got := produce("-retry-attempts", "100", "-retry-for", "0"); !strings.Contains(got, "longer than the 10m0s duplicate window") {
		t.Errorf("no warning about retries outlasting the duplicate window:\n%s", got)
	}
}
