// Command producer publishes intents to a JetStream stream with stable message IDs.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/version"
)

func main() {
	if version.Asked(os.Args[1:]) {
		fmt.Printf("producer %s (%s)\n", version.String(), version.Go())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Producer(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	cli.ReportError(os.Stderr, "producer", os.Args[1:], os.Getenv, "auto", err)
	os.Exit(cli.ExitCode(err))
}
