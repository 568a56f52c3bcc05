package testenv_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestAutoFailoverFormation: the formation pg_auto_failover sets up with two
// data nodes replicates synchronously, the multi-host URL finds the
// primary, and a planned failover moves it to the other node.
func TestAutoFailoverFormation(t *testing.T) {
	f := testenv.NewAutoFailover(t, testenv.AutoFailoverOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	names, err := f.SyncStandbyNames(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(names, "ANY 1") && !strings.Contains(names, "FIRST 1") {
		t.Fatalf("synchronous_standby_names = %q: the secondary is not a synchronous standby", names)
	}
	before, err := f.WaitPrimary(ctx, 2*time.Minute)
	if err != nil || before < 0 {
		t.Fatalf("primary %d: %v", before, err)
	}
	if err := f.PerformFailover(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := f.WaitPrimary(ctx, 2*time.Minute)
	if err != nil || after != 1-before {
		t.Fatalf("primary after the failover: %d (was %d): %v", after, before, err)
	}
	c, err := pgx.Connect(ctx, f.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var ro string
	if err := c.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil || ro != "off" {
		t.Fatalf("the multi-host URL reached a read-only node (%q, %v)", ro, err)
	}
}
