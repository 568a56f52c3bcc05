package outbox_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestNoDatabaseDriverWhereNoneIsUsed: the store-independent outbox
// package links no database driver, and the SQLite side (inbox and
// outbox) links no PostgreSQL driver, so that an embedder on SQLite does
// not build pgx. The SQLite inbox store carries its outbox, so it links
// this package: a driver here would reach every SQLite user.
func TestNoDatabaseDriverWhereNoneIsUsed(t *testing.T) {
	t.Parallel()
	goCmd, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		t.Skipf("no go command to list dependencies with: %v", err)
	}
	const mod = "github.com/jetinbox/jetinbox/"
	for pkg, banned := range map[string][]string{
		"outbox":              {"github.com/jackc/", "modernc.org/sqlite", "github.com/mattn/go-sqlite3"},
		"outbox/sqliteoutbox": {"github.com/jackc/"},
		"inbox/sqliteinbox":   {"github.com/jackc/"},
		"inbox":               {"github.com/jackc/", "github.com/nats-io/"},
	} {
		out, err := exec.CommandContext(t.Context(), goCmd, "list", "-deps", mod+pkg).Output()
		if err != nil {
			var stderr []byte
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				stderr = ee.Stderr
			}
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range banned {
				if strings.HasPrefix(dep, b) {
					t.Errorf("%s links %s", pkg, dep)
				}
			}
		}
	}
}
