// Command consumer applies intents from JetStream exactly once per ID through the inbox.
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
		fmt.Printf("consumer %s (%s)\n", version.String(), version.Go())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Consumer(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	cli.ReportError(os.Stderr, "consumer", os.Args[1:], os.Getenv, "auto", err)
	os.Exit(cli.ExitCode(err))
}
