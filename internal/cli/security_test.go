package cli

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

func nkeyFile(t *testing.T) (seedFile, public string, seed []byte) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ = kp.Seed()
	public, _ = kp.PublicKey()
	seedFile = filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return seedFile, public, seed
}

// TestTLSAndNkeyAuth runs the consumer against a server that demands TLS
// and nkey authentication: with the right key it consumes; with a wrong key
// it fails at once with a clear error and a non-zero exit, and never prints
// a secret.
func TestTLSAndNkeyAuth(t *testing.T) {
	t.Parallel()
	ca := testenv.NewTestCA(t, "jetinbox test CA")
	caFile, srvTLS := ca.File, ca.ServerTLS("127.0.0.1")
	goodSeedFile, goodPub, goodSeed := nkeyFile(t)
	badSeedFile, _, badSeed := nkeyFile(t)
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{Configure: func(o *server.Options) {
		o.TLSConfig, o.TLS, o.TLSTimeout = srvTLS, true, 2
		o.Nkeys = []*server.NkeyUser{{Nkey: goodPub}}
	}})
	url := strings.Replace(srv.URL(), "nats://", "tls://", 1)
	dbURL := testenv.NewDatabase(t)
	if err := migrate(context.Background(), dbURL); err != nil {
		t.Fatal(err)
	}

	// Right key: the producer publishes over TLS, the consumer starts.
	good := mapEnv(map[string]string{"NATS_URL": url, "NATS_CA": caFile, "NATS_NKEY": goodSeedFile, "DATABASE_URL": dbURL})
	var logs bytes.Buffer
	if err := Producer(context.Background(), []string{"-count", "20", "-log-format", "json"}, good, nil, io.Discard, &logs); err != nil {
		t.Fatalf("producer with the right nkey over TLS: %v\n%s", err, logs.String())
	}
	// The consumer runs until it has applied the 20 (it connected and
	// consumed over TLS with the right key), however long a loaded machine
	// takes to get there.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Consumer(ctx, []string{"-http", "", "-log-format", "json"}, good, io.Discard, &logs) }()
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for deadline := time.Now().Add(3 * time.Minute); ; {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM inbox`).Scan(&n); err == nil && n == 20 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("consumer with the right nkey over TLS stopped before applying the 20: %v\n%s", err, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("consumer with the right nkey over TLS applied fewer than 20 in 3 minutes\n%s", logs.String())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consumer with the right nkey over TLS: %v\n%s", err, logs.String())
	}

	// Wrong key: a clear error, exit 2 (the configuration is wrong, a retry
	// cannot help), within seconds, no retry loop.
	bad := mapEnv(map[string]string{"NATS_URL": url, "NATS_CA": caFile, "NATS_NKEY": badSeedFile, "DATABASE_URL": dbURL})
	start := time.Now()
	err = Consumer(context.Background(), []string{"-http", "", "-log-format", "json"}, bad, io.Discard, &logs)
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") || ExitCode(err) != 2 {
		t.Fatalf("consumer with a wrong nkey: %v (exit %d)", err, ExitCode(err))
	}
	if time.Since(start) > 15*time.Second {
		t.Fatalf("a wrong key took %v to fail: a retry loop", time.Since(start))
	}
	// Without the CA the server's certificate is not trusted.
	noCA := mapEnv(map[string]string{"NATS_URL": url, "NATS_NKEY": goodSeedFile, "DATABASE_URL": dbURL})
	if err := Consumer(context.Background(), []string{"-http", ""}, noCA, io.Discard, &logs); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("consumer without NATS_CA: %v", err)
	}
	for _, secret := range [][]byte{goodSeed, badSeed} {
		if bytes.Contains(logs.Bytes(), secret) || (err != nil && strings.Contains(err.Error(), string(secret))) {
			t.Fatal("a secret reached the logs or an error")
		}
	}
	if bytes.Contains(logs.Bytes(), []byte("password")) {
		t.Fatal("logs mention a password")
	}
}

// TestSecretsStayOutOfErrors: passwords in DATABASE_URL and NATS_URL never
// appear in errors or logs.
func TestSecretsStayOutOfErrors(t *testing.T) {
	t.Parallel()
	const pw = "s3cr3t-pw-123"
	var logs bytes.Buffer
	err := Consumer(context.Background(), []string{"-http", ""},
		mapEnv(map[string]string{"DATABASE_URL": "postgres://app:" + pw + "@127.0.0.1:1/db?connect_timeout=2"}), io.Discard, &logs)
	if err == nil || strings.Contains(err.Error(), pw) || strings.Contains(logs.String(), pw) {
		t.Fatalf("database password leaked or no error: %v\n%s", err, logs.String())
	}
	dbURL := testenv.NewDatabase(t)
	if err := migrate(context.Background(), dbURL); err != nil {
		t.Fatal(err)
	}
	err = Consumer(context.Background(), []string{"-http", ""},
		mapEnv(map[string]string{"DATABASE_URL": dbURL, "NATS_URL": "nats://app:" + pw + "@127.0.0.1:1"}), io.Discard, &logs)
	if err == nil || strings.Contains(err.Error(), pw) || strings.Contains(logs.String(), pw) {
		t.Fatalf("NATS password leaked or no error: %v\n%s", err, logs.String())
	}
}
