package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestProducerJSONLInput: a leading BOM is accepted; an oversize line is
// reported with its number and skipped, and the lines after it are still
// published; an ID with invalid UTF-8, or an escape of a lone surrogate,
// is rejected rather than rewritten to U+FFFD.
func TestProducerJSONLInput(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	input := strings.Join([]string{
		"\xEF\xBB\xBF" + `{"id":"b-1","payload":{"account":1,"amount":5}}`,
		`{"id":"b-big","payload":"` + strings.Repeat("x", maxLine) + `"}`,
		"{\"id\":\"b-\xff\",\"payload\":{\"account\":1,\"amount\":5}}",
		`{"id":"b-\udc00","payload":{"account":1,"amount":5}}`,
		`{"id":"b-2","payload":{"account":2,"amount":5}}`,
		`{"id":"b-3","payload":{"account":3,"amount":5}}`,
	}, "\n")
	var out, errOut bytes.Buffer
	err := Producer(context.Background(), []string{"-input", "-"}, mapEnv(map[string]string{"NATS_URL": srv.URL()}),
		strings.NewReader(input), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "3 input lines rejected") {
		t.Fatalf("err = %v, want 3 rejected lines\nstderr:\n%s", err, errOut.String())
	}
	for _, want := range []string{"line 2: longer than 1048576 bytes; skipped", "line 3: not valid UTF-8", "line 4: id: an escape"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut.String())
		}
	}
	if strings.Contains(errOut.String(), "line 1:") || !strings.Contains(out.String(), "published 3 ") {
		t.Fatalf("BOM line or later lines not published: %s\n%s", out.String(), errOut.String())
	}
}

// TestProducerInterruptedPrintsCounts: a signal (ctx) while the producer
// waits on a quiet stdin prints the counts so far and exits 1.
func TestProducerInterruptedPrintsCounts(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	pr, pw := io.Pipe()
	defer pw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Producer(ctx, []string{"-input", "-", "-log-format", "text"}, mapEnv(map[string]string{"NATS_URL": srv.URL()}), pr, &out, &errOut)
	}()
	if _, err := io.WriteString(pw, `{"id":"c-1","payload":{"account":1,"amount":5}}`+"\nnot json\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the line is published; stdin stays open
	cancel()
	select {
	case err := <-done:
		if ExitCode(err) != 1 || !strings.Contains(err.Error(), "interrupted") {
			t.Fatalf("err = %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the producer did not stop on a signal while reading stdin")
	}
	if !strings.Contains(out.String(), "interrupted: published 1 ") || !strings.Contains(out.String(), "bad input lines 1") {
		t.Fatalf("counts so far: %q\nstderr: %s", out.String(), errOut.String())
	}
}
