package app

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestDemoOnGivenServers: with NATS_URL and DATABASE_URL set, the demo runs
// on those servers in a stream and a schema of its own, and its producer
// publishes into that stream, not INTENTS.
func TestDemoOnGivenServers(t *testing.T) {
	t.Parallel()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": testenv.NewDatabase(t)})
	var out, errOut bytes.Buffer
	if err := Demo(context.Background(), []string{"-intents", "600", "-http=false"}, env, nil, &out, &errOut); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	for _, want := range []string{`applied once +600 `, `duplicated +0 +ok`, `lost +0 +ok`} {
		if !regexp.MustCompile(`(?m)^ *` + want).MatchString(out.String()) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDemoWithoutPostgres: on a machine with Go only (the PostgreSQL server
// binaries hidden from PATH and from the directories searched after it) and
// no DATABASE_URL, the demo runs on SQLite in a temporary directory, says so
// first, and loses and duplicates nothing.
func TestDemoWithoutPostgres(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("JETINBOX_PG_SEARCH", "")
	t.Setenv("JETINBOX_PG_BIN", "")
	if dir, err := testenv.FindPostgresBin(); err == nil {
		t.Fatalf("the PostgreSQL binaries are still found, in %s", dir)
	}
	var out, errOut bytes.Buffer
	if err := Demo(context.Background(), []string{"-intents", "1000", "-http=false"}, mapEnv(map[string]string{}), nil, &out, &errOut); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	first, _, _ := strings.Cut(errOut.String(), "\n")
	if !strings.Contains(first, "store: SQLite") || !strings.Contains(first, "no PostgreSQL server binaries") {
		t.Errorf("the first line does not say the demo runs on SQLite: %q", first)
	}
	for _, want := range []string{`applied once +1000 `, `duplicated +0 +ok`, `lost +0 +ok`, `store +sqlite `} {
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
