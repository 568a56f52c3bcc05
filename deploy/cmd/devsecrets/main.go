// Command devsecrets writes the throwaway certificates, nkeys and passwords
// the development compose stack mounts from deploy/secrets/. Development
// only: see deploy/README.md for production.
//
//	cd deploy && go run ./cmd/devsecrets
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/jetinbox/jetinbox/deploy/internal/devsecrets"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "devsecrets:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("devsecrets", flag.ContinueOnError)
	out := fs.String("out", "secrets", "directory to write into (must not exist yet, unless -force)")
	auth := fs.String("auth", filepath.Join("nats", "auth.conf"), "NATS auth template whose public keys are replaced")
	force := fs.Bool("force", false, "write into an existing directory, replacing every credential in it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := os.Stat(*out); err == nil && !*force {
		return fmt.Errorf("%s exists; rotating every credential at once breaks a running stack, pass -force if that is what you want", *out)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	tmpl, err := os.ReadFile(*auth)
	if err != nil {
		return err
	}
	res, err := devsecrets.Generate(devsecrets.Options{Dir: *out, AuthTemplate: tmpl})
	if err != nil {
		return err
	}
	for _, f := range res.Files {
		fmt.Fprintln(stdout, filepath.Join(*out, f))
	}
	fmt.Fprintln(stdout, "development credentials only: readable by you alone (0600), CA key discarded")
	return nil
}
