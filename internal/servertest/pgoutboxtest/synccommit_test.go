package pgoutboxtest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// TestRelayMarkWithCancelledSyncWaitIsNotSent: a round whose mark commit
// had its wait for the synchronous standby cancelled (committed on the
// primary only) returns an error and counts nothing sent; the rows were
// published, and a second publish of the same IDs after a failover is
// dropped by the stream's duplicate window.
func TestRelayMarkWithCancelledSyncWaitIsNotSent(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t) // NATS and the stream; its database is not used
	srv := testenv.NewStandbyless(t)
	url, err := srv.CreateDatabase(ctx, "relay")
	if err != nil {
		t.Fatal(err)
	}
	local, err := pginbox.NewPool(ctx, url+"&synchronous_commit=local")
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	e.pool, e.st = local, pgoutbox.New(local)
	if _, err := e.st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ids := e.add(t, "mark", 5)
	if err := srv.SetSynchronousStandby(ctx, testenv.AbsentStandby); err != nil {
		t.Fatal(err)
	}
	waiting, err := pginbox.NewPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer waiting.Close()
	canceller, err := testenv.StartSyncRepCanceller(ctx, url, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer canceller.Stop() //nolint:errcheck // stopped below

	r := quickRelay(t, &env{pool: waiting, st: pgoutbox.New(waiting), js: e.js}, outbox.RelayConfig{})
	n, err := r.Round(ctx)
	if n != len(ids) || !errors.Is(err, pgoutbox.ErrCommitNotReplicated) {
		t.Fatalf("round: %d rows, err %v; want %d rows and the mark commit not replicated", n, err, len(ids))
	}
	if s := r.Stats(); s.Sent != 0 {
		t.Fatalf("relay counted %d rows sent on a mark commit the standby never confirmed", s.Sent)
	}
	// The canceller counts a cancel once its query returned, which may be
	// after the cancelled COMMIT came back here: wait for the count.
	for deadline := time.Now().Add(30 * time.Second); canceller.Cancelled() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no wait cancelled")
		}
	}
	if c, err := canceller.Stop(); c == 0 || err != nil {
		t.Fatalf("cancelled %d waits (%v)", c, err)
	}
	copies := e.copies(t)
	for _, id := range ids {
		if copies[id] != 1 {
			t.Fatalf("%s published %d times, want once", id, copies[id])
		}
	}
}

// TestRelayChecksCommitWatch: the outbox store tells a pool that cannot
// see a mark commit the standby never confirmed, and a relay on one says
// so when it starts.
func TestRelayChecksCommitWatch(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	url := testenv.NewDatabase(t)
	plain, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := pgoutbox.New(plain).CheckCommitWatch(ctx); !errors.Is(err, pgoutbox.ErrCommitsUnwatched) {
		t.Fatalf("plain pool: %v, want ErrCommitsUnwatched", err)
	}
	var logs strings.Builder
	var mu sync.Mutex
	r := quickRelay(t, &env{pool: e.pool, st: pgoutbox.New(e.pool), js: e.js},
		outbox.RelayConfig{Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	// The relay runs until it has logged its start (or a generous ceiling
	// passes): a loaded machine may take longer than any short run.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- r.Run(rctx) }()
	const warning = "could not confirm that the database pool watches its commits"
	logged := func() string {
		mu.Lock()
		defer mu.Unlock()
		return logs.String()
	}
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(logged(), warning) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if got := logged(); !strings.Contains(got, warning) {
		t.Fatalf("a relay on a pool without the watch logged %q", got)
	}
	watched, err := pginbox.NewPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer watched.Close()
	if err := pgoutbox.New(watched).CheckCommitWatch(ctx); err != nil {
		t.Fatalf("watched pool: %v", err)
	}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
