package cli

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnsafeSQLiteSynchronous: the unsafe switch takes NORMAL only, for a
// SQLite URL only; set, the consumer's file runs with synchronous=NORMAL
// and says so at error level; unset, the same file runs FULL.
func TestUnsafeSQLiteSynchronous(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := "sqlite://" + filepath.Join(t.TempDir(), "x.db")
	st, err := OpenStore(ctx, dbURL, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	st.Close()

	for _, c := range []struct{ env map[string]string }{
		{map[string]string{UnsafeSQLiteSynchronousEnv: "OFF", "DATABASE_URL": dbURL}},
		{map[string]string{UnsafeSQLiteSynchronousEnv: "NORMAL", "DATABASE_URL": "postgres://x"}},
	} {
		err := Consumer(ctx, []string{"-http", ""}, mapEnv(c.env), io.Discard, io.Discard)
		if ExitCode(err) != 2 || !strings.Contains(err.Error(), UnsafeSQLiteSynchronousEnv) {
			t.Errorf("%v: %v (exit %d), want a usage error naming the variable", c.env, err, ExitCode(err))
		}
	}
	// Nothing listens on NATS: the consumer opens the file, then fails.
	var stderr bytes.Buffer
	err = Consumer(ctx, []string{"-http", "", "-log-format", "text"}, mapEnv(map[string]string{UnsafeSQLiteSynchronousEnv: "NORMAL", "DATABASE_URL": dbURL, "NATS_URL": "nats://127.0.0.1:1"}), io.Discard, &stderr)
	if ExitCode(err) != 1 || !strings.Contains(stderr.String(), "level=ERROR") || !strings.Contains(stderr.String(), "UNSAFE") {
		t.Errorf("NORMAL: %v (exit %d); log:\n%s", err, ExitCode(err), stderr.String())
	}
	stderr.Reset()
	_ = Consumer(ctx, []string{"-http", "", "-log-format", "text"}, mapEnv(map[string]string{"DATABASE_URL": dbURL, "NATS_URL": "nats://127.0.0.1:1"}), io.Discard, &stderr)
	if strings.Contains(stderr.String(), "UNSAFE") {
		t.Errorf("unset, the consumer still warns:\n%s", stderr.String())
	}

	for _, c := range []struct {
		open func() (*Store, error)
		want int
	}{
		{func() (*Store, error) { return openSQLiteUnsafeNormal(ctx, dbURL) }, 1},
		{func() (*Store, error) { return OpenStore(ctx, dbURL, 1, nil) }, 2},
	} {
		st, err := c.open()
		if err != nil {
			t.Fatal(err)
		}
		var level int
		if err := st.SQLite.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&level); err != nil {
			t.Fatal(err)
		}
		st.Close()
		if level != c.want {
			t.Errorf("synchronous = %d, want %d", level, c.want)
		}
	}
}
