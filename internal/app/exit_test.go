package app

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"path"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestExitCodeConvention runs every jetinbox command with an unknown flag
// and with a value that does not parse: both are usage errors, exit 2, and
// -h (exit 0) ends with the convention.
func TestExitCodeConvention(t *testing.T) {
	t.Parallel()
	badValue := map[string][]string{
		"demo":       {"-intents", "many"},
		"accounts":   {"-list=maybe"},
		"dlq":        {"-show", "x"},
		"migrate":    {"-print=maybe"},
		"verify":     {"-from-seq", "-3"},
		"consumer":   {"-batch", "x"},
		"replay":     {"-batch", "x"},
		"prune":      {"-margin", "soon"},
		"relay":      {"-batch", "x"},
		"deliver":    {"-lease", "soon"},
		"console":    {"-retention", "soon"},
		"bench":      {"-n", "x"},
		"chaos":      {"-intents", "x"},
		"jitter":     {"-clients", "x"},
		"partitions": {"list", "-replicas", "x"},
		"intake":     {"-wait", "soon"},
	}
	for name := range commands() {
		bad, ok := badValue[name]
		if !ok {
			t.Errorf("no bad-value case for command %s", name)
			continue
		}
		for _, args := range [][]string{{"-no-such-flag"}, bad} {
			var stderr bytes.Buffer
			err := Jetinbox(context.Background(), append([]string{name}, args...), mapEnv(nil), nil, io.Discard, &stderr)
			if got := cli.ExitCode(err); got != 2 {
				t.Errorf("jetinbox %s %v: exit %d, want 2 (err %v)", name, args, got, err)
			}
		}
		var help bytes.Buffer
		err := Jetinbox(context.Background(), []string{name, "-h"}, mapEnv(nil), nil, io.Discard, &help)
		if !errors.Is(err, flag.ErrHelp) || cli.ExitCode(err) != 0 {
			t.Errorf("jetinbox %s -h: %v", name, err)
		}
		if !strings.Contains(help.String(), cli.ExitCodes) {
			t.Errorf("jetinbox %s -h does not state the exit codes", name)
		}
	}
	// Values that parse but are out of range are usage errors too, before
	// any server starts.
	for _, args := range [][]string{
		{"bench", "-n", "-5"}, {"bench", "-rate", "0"}, {"bench", "-only", "fast"}, {"bench", "-latency", "-1s"},
		{"chaos", "-crash", "1.5"}, {"chaos", "-poison", "-0.1"}, {"chaos", "-drop-publish", "NaN"},
		{"chaos", "-intents", "0"}, {"chaos", "-give-ups", "-1"}, {"chaos", "-producers", "sometimes"},
		{"relay", "-batch", "0"}, {"relay", "-publish-batch", "5000"},
		{"jitter", "-clients", "-3"}, {"jitter", "-cap", "1ms", "-base", "1s"}, {"jitter", "extra"},
		{"intake", "-wait", "0s"}, {"intake", "-retention", "-1h"}, {"intake", "-tls-cert", "c.pem"},
		{"chaos", "-http", "-drop-request", "2"}, {"bench", "-http", "-requests", "1"},
	} {
		err := Jetinbox(context.Background(), args, mapEnv(nil), nil, io.Discard, io.Discard)
		if got := cli.ExitCode(err); got != 2 || !strings.Contains(err.Error(), "-"+strings.TrimPrefix(args[1], "-")) && args[1] != "extra" {
			t.Errorf("jetinbox %v: exit %d, want 2 naming the flag (err %v)", args, got, err)
		}
	}
	var top bytes.Buffer
	if err := Jetinbox(context.Background(), []string{"-h"}, mapEnv(nil), nil, io.Discard, &top); err != nil || !strings.Contains(top.String(), cli.ExitCodes) {
		t.Errorf("jetinbox -h: %v, exit codes stated: %v", err, strings.Contains(top.String(), cli.ExitCodes))
	}
}

// TestServerRefusalsExitTwo: a stream the server does not have, or a
// database that does not exist, is a configuration error in every command
// that reads them: exit 2 (never verify's 1 for violations) with a message
// that says what to check.
func TestServerRefusalsExitTwo(t *testing.T) {
	t.Parallel()
	srv, dbURL, _, _ := commandPipeline(t, 0, "cfg")
	noDB := strings.Replace(dbURL, "/"+path.Base(strings.SplitN(dbURL, "?", 2)[0]), "/no_such_database", 1)
	unmigrated := testenv.NewDatabase(t)
	cases := []struct {
		name string
		args []string
		db   string
		want string
	}{
		{"verify", []string{"verify", "-stream", "NOPE"}, dbURL, "stream NOPE not found"},
		{"replay", []string{"replay", "-stream", "NOPE"}, dbURL, "stream NOPE not found"},
		{"dlq", []string{"dlq", "-stream", "NOPE"}, dbURL, "stream NOPE not found"},
		{"prune", []string{"prune", "-stream", "NOPE", "-older-than", "2000h"}, dbURL, "NOPE"},
		{"verify-db", []string{"verify"}, noDB, "no_such_database"},
		{"accounts-db", []string{"accounts", "-list"}, noDB, "no_such_database"},
		// A database nobody migrated: the consumer refuses to start and
		// verify has no tables to read; both say to run migrate.
		{"consumer-unmigrated", []string{"consumer"}, unmigrated, "migrate"},
		{"verify-unmigrated", []string{"verify"}, unmigrated, "migrate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": c.db})
			var stderr bytes.Buffer
			err := Jetinbox(context.Background(), c.args, env, nil, io.Discard, &stderr)
			if got := cli.ExitCode(err); got != 2 {
				t.Fatalf("jetinbox %v: exit %d, want 2 (err %v)", c.args, got, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("jetinbox %v: %v, want it to mention %q", c.args, err, c.want)
			}
		})
	}
}
