package testenv

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var (
	sharedMu  sync.Mutex
	sharedPG  *Postgres
	sharedErr error
	dbSeq     atomic.Int64
)

// Main runs a package's tests and stops the shared PostgreSQL cluster, if one
// was started, when they finish. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) { os.Exit(run(m)) }

// MainNoLeaks is Main for packages whose code starts goroutines: once the
// tests passed and the shared cluster is stopped, it fails the run if any
// goroutine is left that the tests started and did not end, as
// goleak.VerifyTestMain does. opts ignore more goroutines than
// [KnownGoroutines]:
//
//	func TestMain(m *testing.M) { testenv.MainNoLeaks(m) }
func MainNoLeaks(m *testing.M, opts ...goleak.Option) {
	code := run(m)
	if code == 0 {
		if err := goleak.Find(append(KnownGoroutines(), opts...)...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left after the tests passed: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// KnownGoroutines are the goroutines a test binary may still run after its
// tests without any test having leaked them: nats.go's Fetch leaves one that
// waits out the pull request's expiry (FetchMaxWait plus a second) even
// after its connection closed, and ends then. nats-server (2.15) stages
// each atomic batch of a file stream in a file store of its own; a batch
// whose first message arrives while the server shuts down gets a store
// that is never stopped (its flush loops, and the access-time ticker they
// hold). Tests that restart a server under group-commit publishing meet it;
// a server left running would still show by its other goroutines.
func KnownGoroutines() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*pullConsumer).fetch.func1"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	}
}

// run runs the tests, then stops the shared cluster.
func run(m *testing.M) int {
	code := m.Run()
	CloseShared()
	return code
}

// CloseShared stops the shared PostgreSQL cluster if one was started. Main
// calls it; a TestMain of its own that cannot call Main must call it after
// m.Run, or the server outlives the test binary.
func CloseShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedPG != nil {
		_ = sharedPG.Close()
		sharedPG = nil
	}
}

// SharedPostgres returns the test binary's one PostgreSQL cluster, starting it
// on first use. A missing PostgreSQL installation fails the test with a
// message saying what to install; it never skips.
func SharedPostgres(t testing.TB) *Postgres {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedPG == nil && sharedErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sharedPG, sharedErr = StartPostgres(ctx, PostgresOptions{})
	}
	if sharedErr != nil {
		t.Fatalf("PostgreSQL is required for this test: %v", sharedErr)
	}
	return sharedPG
}

var unsafeName = regexp.MustCompile(`[^a-z0-9_]+`)

// CreateSharedDatabase creates a database on the shared cluster, starting the
// cluster if needed, for code without a testing.TB such as Example functions.
func CreateSharedDatabase(prefix string) (string, error) {
	sharedMu.Lock()
	if sharedPG == nil && sharedErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		sharedPG, sharedErr = StartPostgres(ctx, PostgresOptions{})
		cancel()
	}
	pg, err := sharedPG, sharedErr
	sharedMu.Unlock()
	if err != nil {
		return "", err
	}
	return pg.CreateDatabase(context.Background(), fmt.Sprintf("x%d_%s", dbSeq.Add(1), prefix))
}

// NewDatabase creates a fresh database on the shared cluster for this test and
// returns its URL. Tests are isolated by database, so they may run in parallel.
func NewDatabase(t testing.TB) string {
	t.Helper()
	pg := SharedPostgres(t)
	name := unsafeName.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	name = fmt.Sprintf("t%d_%s", dbSeq.Add(1), name)
	url, err := pg.CreateDatabase(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return url
}
