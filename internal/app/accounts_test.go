package app

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestAccountsOpenAndList: accounts open once, again is a no-op for the
// ones that exist, list shows them; bad ranges are usage errors.
func TestAccountsOpenAndList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := mapEnv(map[string]string{"DATABASE_URL": testenv.NewDatabase(t)})
	if err := Migrate(ctx, nil, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	var status bytes.Buffer
	if err := Jetinbox(ctx, []string{"migrate", "-status"}, env, nil, &status, io.Discard); err != nil ||
		strings.Count(status.String(), "applied") < 3 || strings.Contains(status.String(), "pending") {
		t.Fatalf("migrate -status: %v\n%s", err, status.String())
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := Jetinbox(ctx, append([]string{"accounts"}, args...), env, nil, &out, io.Discard)
		return out.String(), err
	}
	if out, err := run("-open", "1-5"); err != nil || !strings.Contains(out, "opened 5 accounts") {
		t.Fatalf("open 1-5: %q, %v", out, err)
	}
	if out, err := run("-open", "3-7,9"); err != nil || !strings.Contains(out, "opened 3 accounts (6 asked for, 3 existed)") {
		t.Fatalf("open 3-7,9: %q, %v", out, err)
	}
	out, err := run("-list")
	if err != nil || strings.Count(out, "\n") != 8 || !strings.HasPrefix(out, "1\t0\n") {
		t.Fatalf("list: %q, %v", out, err)
	}
	for _, bad := range [][]string{{"-open", "0-3"}, {"-open", "5-2"}, {"-open", "x"}, {"-open", "1-99999999999"}, {}, {"stray"}} {
		if _, err := run(bad...); cli.ExitCode(err) != 2 {
			t.Errorf("accounts %q: exit %d (%v), want 2", bad, cli.ExitCode(err), err)
		}
	}
}
