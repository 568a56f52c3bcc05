package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/console"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/failpoint"
)

// demoConsoleRun is what the demo's console points at: the run's servers
// and the IDs worth looking up.
type demoConsoleRun struct {
	js                      jetstream.JetStream
	store                   *cli.Store
	stream, scope, durable  string
	applied, replayed, dead string
	conflict                string
	fleet                   *demoFleet
	listen, screenshots     string
}

// demoConsole serves the console on the run's servers, prints its URL and
// the pages of the run's telling IDs, restarts one consumer so that a
// re-drive is applied, and keeps serving until ctx ends (the user's
// Ctrl-C). With screenshots set it photographs each page there instead,
// and returns.
func demoConsole(ctx context.Context, d demoConsoleRun, stdout io.Writer) error {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	token := hex.EncodeToString(b[:])
	cfg := console.Config{JS: d.js, ReadPG: d.store.PG, ReadSQLite: d.store.SQLite, Stream: d.stream, Scope: d.scope, Durable: d.durable,
		OperatorToken: token, Redrive: &console.Redrive{JS: d.js, Store: d.store}, Logger: slog.New(slog.DiscardHandler)}
	h, err := console.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", d.listen)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("-console-listen: %w", err)}
	}
	srv := serveConsole(ln, h)
	defer srv.Close()
	base := fmt.Sprintf("http://%s/", ln.Addr())
	if d.screenshots != "" {
		return console.Screenshots(ctx, base, d.screenshots, console.DefaultShots(false), stdout)
	}
	// A consumer again, so that what is re-driven is applied.
	d.fleet.mu.Lock()
	d.fleet.stopped = false
	d.fleet.mu.Unlock()
	if err := d.fleet.start(ctx, 99, failpoint.New()); err != nil {
		return err
	}
	defer d.fleet.stopAll()
	look := func(id string) string { return base + "intent?id=" + url.QueryEscape(id) }
	fmt.Fprintf(stdout, "\nconsole on %s (Ctrl-C to stop); operator token for re-drives: %s\n", base, token)
	fmt.Fprintf(stdout, "  applied once:               %s\n", look(d.applied))
	fmt.Fprintf(stdout, "  published again, once:      %s\n", look(d.replayed))
	fmt.Fprintf(stdout, "  reused ID, other payload:   %s\n", look(d.conflict))
	fmt.Fprintf(stdout, "  dead-lettered:              %s\n", look(d.dead))
	fmt.Fprintf(stdout, "  dead letters, re-drive:     %sdlq\n  verify:                     %sverify?run=1\n", base, base)
	<-ctx.Done()
	return nil
}
