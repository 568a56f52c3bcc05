package cli

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// heavy are packages, or module path prefixes, that the consumer and the
// producer binaries must not link: the operator CLI and what it needs for
// the demo, the benchmark, the chaos harness and the retry-storm chart.
var heavy = []string{
	"github.com/jetinbox/jetinbox/internal/app",
	"github.com/jetinbox/jetinbox/internal/bench",
	"github.com/jetinbox/jetinbox/internal/chaos",
	"github.com/jetinbox/jetinbox/internal/jittersim",
	"github.com/jetinbox/jetinbox/internal/testenv",
	"github.com/nats-io/nats-server/v2",
	"testing",
	// The chart library and what only it brings in.
	"gonum.org/v1/plot",
	"codeberg.org/go-fonts",
	"codeberg.org/go-latex",
	"codeberg.org/go-pdf",
	"git.sr.ht/~sbinet/gg",
	"github.com/ajstarks/svgo",
	"github.com/golang/freetype",
	"golang.org/x/image",
}

func isHeavy(pkg string) bool {
	for _, h := range heavy {
		if pkg == h || strings.HasPrefix(pkg, h+"/") {
			return true
		}
	}
	return false
}

// TestBinariesStayLight: `go list -deps` of cmd/consumer and cmd/producer
// holds none of the heavy packages. A failure names each import of a heavy
// package by one that is not: the edges to cut.
func TestBinariesStayLight(t *testing.T) {
	t.Parallel()
	goCmd, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		t.Skipf("no go command to list dependencies with: %v", err)
	}
	for _, cmd := range []string{"consumer", "producer"} {
		pkg := "github.com/jetinbox/jetinbox/cmd/" + cmd
		out, err := exec.CommandContext(t.Context(), goCmd, "list", "-deps",
			"-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", pkg).Output()
		if err != nil {
			var stderr []byte
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				stderr = ee.Stderr
			}
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		importedBy := make(map[string][]string)
		for _, l := range lines {
			f := strings.Fields(l)
			for _, imp := range f[1:] {
				importedBy[imp] = append(importedBy[imp], f[0])
			}
		}
		t.Logf("go list -deps ./cmd/%s: %d packages", cmd, len(lines))
		var linked []string
		for _, l := range lines {
			p, _, _ := strings.Cut(l, " ")
			if !isHeavy(p) {
				continue
			}
			linked = append(linked, p)
			for _, by := range importedBy[p] {
				if !isHeavy(by) {
					t.Errorf("cmd/%s: %s imports %s", cmd, by, p)
				}
			}
		}
		if len(linked) > 0 {
			t.Errorf("cmd/%s links %d packages it must not: %s", cmd, len(linked), strings.Join(linked, " "))
		}
	}
}
