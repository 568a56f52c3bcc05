package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
)

// TestExitCodeTable runs the consumer and the producer with an unknown
// flag, a value that does not parse and values out of range: every one is
// a usage error, exit 2, with a message that names the flag.
func TestExitCodeTable(t *testing.T) {
	t.Parallel()
	env := mapEnv(map[string]string{"DATABASE_URL": "postgres://x", "NATS_URL": "nats://127.0.0.1:1"})
	run := map[string]func(args []string, stderr io.Writer) error{
		"consumer": func(args []string, w io.Writer) error {
			return Consumer(context.Background(), args, env, io.Discard, w)
		},
		"producer": func(args []string, w io.Writer) error {
			return Producer(context.Background(), args, env, strings.NewReader(""), io.Discard, w)
		},
	}
	cases := []struct {
		cmd  string
		args []string
		want string
	}{
		{"consumer", []string{"-no-such-flag"}, "no-such-flag"},
		{"consumer", []string{"-batch", "many"}, "-batch"},
		{"producer", []string{"-no-such-flag"}, "no-such-flag"},
		{"producer", []string{"-count", "many"}, "-count"},
		{"consumer", []string{"-batch", "-5"}, "-batch -5"},
		{"consumer", []string{"-inflight", "-1"}, "-inflight"},
		{"consumer", []string{"-ack-wait", "-1s"}, "-ack-wait"},
		{"consumer", []string{"-db-conns", "-3"}, "-db-conns"},
		{"consumer", []string{"-max-deliver", "0"}, "-max-deliver"},
		{"consumer", []string{"-max-ack-pending", "-1"}, "-max-ack-pending"},
		{"consumer", []string{"-drain-timeout", "0s"}, "-drain-timeout"},
		{"consumer", []string{"-log-format", "yaml"}, "yaml"},
		{"consumer", []string{"-http", "localhost"}, "-http"},
		{"consumer", []string{"-http", ":99999"}, "-http"},
		{"consumer", []string{"-nats-url", "nats://[::1"}, "bad NATS URL"},
		{"producer", []string{"-count", "-5"}, "-count -5"},
		{"producer", []string{"-max-inflight", "0"}, "-max-inflight"},
		{"producer", []string{"-retry-for", "-1s"}, "MaxElapsed -1s"},
		{"producer", []string{"-rate", "-1"}, "-rate"},
		{"producer", []string{"-accounts", "0"}, "-accounts"},
		{"producer", []string{"-ack-timeout", "0s"}, "-ack-timeout"},
		{"producer", []string{"-replicas", "7"}, "-replicas"},
		{"producer", []string{"-duplicate-window", "-1m"}, "-duplicate-window"},
		{"producer", []string{"-log-format", "yaml"}, "yaml"},
		{"producer", []string{"-http", "nope"}, "-http"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.cmd, c.args), func(t *testing.T) {
			var stderr bytes.Buffer
			err := run[c.cmd](c.args, &stderr)
			if got := ExitCode(err); got != 2 || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%s %v: exit %d, err %v; want 2 and %q", c.cmd, c.args, got, err, c.want)
			}
		})
	}
	for name, r := range run {
		var help bytes.Buffer
		err := r([]string{"-h"}, &help)
		if !errors.Is(err, flag.ErrHelp) || ExitCode(err) != 0 {
			t.Errorf("%s -h: %v", name, err)
		}
		if !strings.Contains(help.String(), ExitCodes) {
			t.Errorf("%s -h does not state the exit codes", name)
		}
	}
}
