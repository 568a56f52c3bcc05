package cli

import (
	"context"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestOpenDBBehindPooler: OpenDB keeps pgx's prepared-statement cache on a
// direct connection, runs without named prepared statements behind a
// pgbouncer in transaction mode, and takes the URL's
// default_query_exec_mode when it sets one, either way. Its probe leaves
// no prepared statement on a server connection for the next client to
// collide with.
func TestOpenDBBehindPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := testenv.NewDatabase(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	// One server connection: every client meets what the others left on it.
	bouncer := testenv.NewPgBouncer(t, testenv.PgBouncerOptions{PoolSize: 1})
	pooled := bouncer.URL(strings.TrimPrefix(u.Path, "/"))
	for _, c := range []struct {
		name, url  string
		wantPooled bool
		want       pgx.QueryExecMode
	}{
		{"direct", direct, false, pgx.QueryExecModeCacheStatement},
		{"direct, mode set", testenv.WithQueryExecMode(direct, "exec"), false, pgx.QueryExecModeExec},
		{"pgbouncer", pooled, true, PoolerExecMode},
		{"pgbouncer, a second client", pooled, true, PoolerExecMode},
		{"pgbouncer, mode set", testenv.WithQueryExecMode(pooled, "exec"), true, pgx.QueryExecModeExec},
		{"pgbouncer, key=value", "host=" + bouncer.SocketDir() + " port=" + strconv.Itoa(bouncer.Port()) + " user=postgres dbname=" + strings.TrimPrefix(u.Path, "/") + " default_query_exec_mode = simple_protocol",
			true, pgx.QueryExecModeSimpleProtocol},
	} {
		pool, pooled, err := openDB(ctx, c.url, 2, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		// A statement through the pool's own connections tells the mode
		// they run in, and that it works.
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := conn.Conn().Config().DefaultQueryExecMode
		var one int
		err = conn.QueryRow(ctx, "SELECT $1::int", 1).Scan(&one)
		conn.Release()
		pool.Close()
		if err != nil || pooled != c.wantPooled || got != c.want {
			t.Errorf("%s: pooler %v (want %v), mode %v (want %v), query: %v", c.name, pooled, c.wantPooled, got, c.want, err)
		}
	}
}
