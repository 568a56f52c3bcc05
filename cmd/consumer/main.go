// Command consumer applies intents from JetStream exactly once per ID through the inbox.
package main

import (
	"context"
	"errors"
	"flag"
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
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "consumer:", err)
	}
	os.Exit(cli.ExitCode(err))
}
