package subproc

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
)

// RoleNATSServer is the role of a child running [NATSServer].
const RoleNATSServer = "nats-server"

// RoleJetinbox is the role of a child running the jetinbox CLI (in tests:
// the commands the test registers, such as `consumer`).
const RoleJetinbox = "jetinbox"

// NATSServer runs the nats-server linked into this binary, as the
// nats-server command does: its flags (-c FILE for a configuration file,
// -p, -sd, --cluster, --routes, ...), with JetStream always on. SIGTERM
// and SIGINT shut it down cleanly (exit 0); a bad flag or configuration
// exits 2; a server that does not start exits 1. It is the
// [RoleNATSServer] role.
func NATSServer(args []string) int {
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	helped := false
	help := func() { helped = true; fs.PrintDefaults() }
	opts, err := server.ConfigureOptions(fs, args, func() { fmt.Println("nats-server", server.VERSION); helped = true }, help, help)
	if helped || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nats-server: %v\n", err)
		return 2
	}
	opts.JetStream = true
	// Signals are handled here: the server's own handler calls os.Exit
	// from its goroutine.
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nats-server: %v\n", err)
		return 2
	}
	s.ConfigureLogger()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go s.Start()
	go func() {
		<-sig
		s.Shutdown()
	}()
	// A server that cannot start (a port in use, a store it cannot open)
	// logs the reason and exits 1 from its Fatalf.
	s.WaitForShutdown()
	return 0
}
