package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"regexp"
	"testing"

	"github.com/jetinbox/jetinbox/internal/cli"
)

// TestBenchRelaySmoke runs `bench -relay` small: both modes side by side,
// their ratio and emit-to-publish; a bad mode is a usage error.
func TestBenchRelaySmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own servers")
	}
	var out bytes.Buffer
	err := RelayMain(context.Background(), []string{"-n", "300", "-rounds", "1", "-batch", "100", "-latency", "300ms", "-rate", "200", "-sync", "default", "-modes", "each,atomic,fast"}, &out, io.Discard)
	if err != nil {
		t.Fatalf("bench -relay: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		`(?m)^default \(2 min\) +each +\d+ +1\.00x +\d+ +\d+\.\d ms +\d+\.\d ms`,
		`(?m)^default \(2 min\) +atomic +\d+ +\d+\.\d\dx +[1-9]\d* +\d+\.\d ms +\d+\.\d ms`,
		`(?m)^default \(2 min\) +fast +\d+ +\d+\.\d\dx +[1-9]\d* +\d+\.\d ms +\d+\.\d ms`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("output lacks %s:\n%s", want, out.String())
		}
	}
	var usage cli.UsageError
	if err := RelayMain(context.Background(), []string{"-modes", "each,slow"}, io.Discard, io.Discard); !errors.As(err, &usage) {
		t.Errorf("bench -relay -modes each,slow: %v, want a usage error", err)
	}
}
