package pgwatch_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/internal/pgwatch"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestCommitsShareAConnection: a pool's transaction gives its connection
// back inside Commit, so the next holder may begin its own COMMIT on it
// before Commit has read what the last one was told. Goroutines
// committing one after another on one connection must neither race (run
// with -race) nor see a warning the other's statement raised as their own
// COMMIT's, beyond the safe side.
func TestCommitsShareAConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pgwatch.Install(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE t (n int)`); err != nil {
		t.Fatal(err)
	}
	if err := pgwatch.Check(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				tx, err := pool.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, i); err != nil {
					errs <- err
					return
				}
				if err := pgwatch.Commit(ctx, tx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a COMMIT with nothing to warn about: %v", err)
	}
}
