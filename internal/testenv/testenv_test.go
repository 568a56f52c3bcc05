package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { MainNoLeaks(m) }

func TestPostgresRestart(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	pg, err := StartPostgres(ctx, PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	t.Logf("cluster started in %v", time.Since(start))
	url, err := pg.CreateDatabase(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) {
		t.Helper()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec("CREATE TABLE x (id int); INSERT INTO x VALUES (1)")
	if err := pg.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.Connect(ctx, url); err == nil {
		t.Fatal("connect succeeded while the server was killed")
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	exec("SELECT 1/count(*) FROM x")
}

func TestNewDatabaseIsolated(t *testing.T) {
	a, b := NewDatabase(t), NewDatabase(t)
	if a == b {
		t.Fatalf("same database twice: %s", a)
	}
}
