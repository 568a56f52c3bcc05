package jsinbox

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

func TestAPIPrefix(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		o    jetstream.JetStreamOptions
		want string
	}{
		{jetstream.JetStreamOptions{}, "$JS.API."},
		{jetstream.JetStreamOptions{Domain: "hub"}, "$JS.hub.API."},
		{jetstream.JetStreamOptions{APIPrefix: "JS.acc"}, "JS.acc."},
		{jetstream.JetStreamOptions{APIPrefix: "JS.acc."}, "JS.acc."},
	} {
		o, want := c.o, c.want
		if got := apiPrefix(o); got != want {
			t.Errorf("apiPrefix(%+v) = %q, want %q", o, got, want)
		}
	}
}
