package deploy_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/console"
)

// consoleUnderVerifier opens the console's pages as `jetinbox console`
// reads them in production: the verifier's NATS user (account VERIFY:
// stream and consumer info, direct gets, no consumer of its own) and
// database role. Every page answers, with nothing it could not read, and
// the verifier publishes nothing it may not (rec).
func consoleUnderVerifier(t *testing.T, ctx context.Context, url string, fx *secretsFixture, dsn, stream, durable string, admin *nats.Conn) {
	t.Helper()
	rec := startRecording(t, admin)
	verifier := connectAs(t, url, fx, "verify")
	defer verifier.nc.Close()
	js, err := jetstream.New(verifier.nc)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var applied string
	if err := pool.QueryRow(ctx, `SELECT message_id FROM inbox WHERE status = 'applied' LIMIT 1`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	h, err := console.New(console.Config{JS: js, ReadPG: pool, Stream: stream, Scope: durable, Durable: durable})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for path, want := range map[string]string{
		"/":                     "Horizon check",
		"/intent?id=" + applied: "applied once at",
		"/dlq":                  "dead letters of scope",
		"/verify?run=1":         "clean: every message applied once or dead-lettered",
	} {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		page := string(b)
		if res.StatusCode != http.StatusOK || !strings.Contains(page, want) ||
			strings.Contains(page, "could not be read") || strings.Contains(page, "permission") || strings.Contains(page, `class="warn">durable`) ||
			strings.Contains(page, `class="warn">stream`) || strings.Contains(page, `class="warn">dead letters`) {
			t.Errorf("console %s under the verify role: %d, want %q and no read refused:\n%s", path, res.StatusCode, want, page)
		}
	}
	verifier.expectNoAsyncError(t)
	rec.check(t, "console", verifyPublish)
}
