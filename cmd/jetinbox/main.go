// Command jetinbox is the operator CLI: demo, migrate, verify, jitter.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jetinbox/jetinbox/internal/app"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/internal/version"
)

func main() {
	// The chaos runs start this binary again as nats-servers and as
	// `jetinbox consumer` processes.
	subproc.Dispatch(map[string]func([]string) int{
		subproc.RoleNATSServer: subproc.NATSServer,
		subproc.RoleJetinbox:   run,
	})
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if version.Asked(args) {
		fmt.Printf("jetinbox %s (%s)\n", version.String(), version.Go())
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := app.Jetinbox(ctx, args, os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	cli.ReportError(os.Stderr, "jetinbox", args, os.Getenv, "text", err)
	return cli.ExitCode(err)
}
