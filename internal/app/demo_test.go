package app

import (
	"bytes"
	"context"
	"regexp"
	"testing"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestDemoOnGivenServers: with NATS_URL and DATABASE_URL set, the demo runs
// on those servers in a stream and a schema of its own, and its producer
// publishes into that stream, not INTENTS.
func TestDemoOnGivenServers(t *testing.T) {
	t.Parallel()
	srv := testenv.NewNATS(t, testenv.NATSOptions{})
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": testenv.NewDatabase(t)})
	var out, errOut bytes.Buffer
	if err := Demo(context.Background(), []string{"-intents", "600"}, env, nil, &out, &errOut); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	for _, want := range []string{`applied once +600 `, `duplicated +0 +ok`, `lost +0 +ok`} {
		if !regexp.MustCompile(`(?m)^ *` + want).MatchString(out.String()) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDemoCluster: the demo on three embedded nodes with R3 streams, with
// the stream leader killed halfway through publishing, ends verified.
func TestDemoCluster(t *testing.T) {
	t.Parallel()
	env := mapEnv(map[string]string{"DATABASE_URL": testenv.NewDatabase(t)})
	var out, errOut bytes.Buffer
	if err := Demo(context.Background(), []string{"-cluster", "-intents", "600"}, env, nil, &out, &errOut); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	for _, want := range []string{`applied once +600 `, `duplicated +0 +ok`, `lost +0 +ok`, `unexpected +0 +ok`} {
		if !regexp.MustCompile(`(?m)^ *` + want).MatchString(out.String()) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	if !regexp.MustCompile(`killed n\d, the leader of stream`).MatchString(errOut.String()) {
		t.Errorf("no leader was killed:\n%s", errOut.String())
	}
	if err := Demo(context.Background(), []string{"-cluster"}, mapEnv(map[string]string{"NATS_URL": "nats://127.0.0.1:1"}), nil, &out, &errOut); err == nil {
		t.Error("-cluster with NATS_URL set was accepted")
	}
}
