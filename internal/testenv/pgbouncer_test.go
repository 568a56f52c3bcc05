package testenv

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPgBouncerSharesServerConnections: two clients of a pool of one
// server connection meet the same backend, one transaction after the
// other (transaction pooling), and a database created on the cluster is
// reachable through the pooler by its name.
func TestPgBouncerSharesServerConnections(t *testing.T) {
	ctx := context.Background()
	direct := NewDatabase(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	b := NewPgBouncer(t, PgBouncerOptions{PoolSize: 1})
	via := WithQueryExecMode(b.URL(strings.TrimPrefix(u.Path, "/")), "exec")
	pids := make([]uint32, 2)
	var conns []*pgx.Conn
	for i := range pids {
		c, err := pgx.Connect(ctx, via)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		conns = append(conns, c)
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pids[i]); err != nil {
			t.Fatal(err)
		}
	}
	if pids[0] != pids[1] {
		t.Fatalf("two clients of a pool of one got backends %d and %d: not transaction pooling", pids[0], pids[1])
	}
	var db string
	if err := conns[0].QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || "/"+db != u.Path {
		t.Fatalf("through the pooler: database %q (%v), want %s", db, err, u.Path)
	}
}

// TestPgBouncerMissing: without the binary StartPgBouncer says what to
// install (and NewPgBouncer fails the test with it; it never skips).
func TestPgBouncerMissing(t *testing.T) {
	t.Setenv("JETINBOX_PGBOUNCER", "/nonexistent/pgbouncer")
	_, err := StartPgBouncer(context.Background(), SharedPostgres(t), PgBouncerOptions{})
	if !errors.Is(err, ErrNoPgBouncer) || !strings.Contains(err.Error(), "apt-get install -y pgbouncer") {
		t.Fatalf("StartPgBouncer without the binary: %v", err)
	}
}
