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
	"github.com/jetinbox/jetinbox/internal/version"
)

func main() {
	if version.Asked(os.Args[1:]) {
		fmt.Printf("jetinbox %s (%s)\n", version.String(), version.Go())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := app.Jetinbox(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	cli.ReportError(os.Stderr, "jetinbox", os.Args[1:], os.Getenv, "text", err)
	os.Exit(cli.ExitCode(err))
}
