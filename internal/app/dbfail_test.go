package app

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestCommandsOnSQLASCIIDatabase: a database created under LANG=C has
// the encoding SQL_ASCII. migrate, accounts, the consumer's start-up
// checks, verify and replay work on it, directly and through a pooler: the
// sessions ask for client_encoding UTF8 and the pooler probe needs no
// simple protocol. Only what cannot work is refused, saying why: pgx's
// simple protocol on a session the URL puts in another client encoding.
func TestCommandsOnSQLASCIIDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.SharedPostgres(t)
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	name := "ascii_" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "_")
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()+` ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'`); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	direct := pg.URL(name)
	bouncer := testenv.NewPgBouncer(t, testenv.PgBouncerOptions{})
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	for i, dbURL := range []string{direct, bouncer.URL(name)} {
		env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})
		var out bytes.Buffer
		if err := Migrate(ctx, nil, env, nil, &out, io.Discard); err != nil {
			t.Fatalf("migrate on SQL_ASCII (%d): %v\n%s", i, err, out.String())
		}
		if err := Accounts(ctx, []string{"-open", "1-8"}, env, nil, io.Discard, io.Discard); err != nil {
			t.Fatalf("accounts on SQL_ASCII (%d): %v", i, err)
		}
		store, err := cli.OpenStore(ctx, dbURL, 2, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("open (%d): %v", i, err)
		}
		err = store.CheckWritable(ctx)
		store.Close()
		if err != nil {
			t.Fatalf("check (%d): %v", i, err)
		}
	}
	// A run end to end on the direct URL: the intents applied once.
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": direct})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Producer(ctx, []string{"-count", "50", "-prefix", "ascii", "-accounts", "8"}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	consumeSettled(t, env, js)
	var out bytes.Buffer
	if err := Verify(ctx, []string{"-json"}, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), `"applied_once": 50`) {
		t.Fatalf("verify on SQL_ASCII: %v\n%s", err, out.String())
	}

	u, _ := url.Parse(direct)
	q := u.Query()
	q.Set("client_encoding", "SQL_ASCII")
	q.Set("default_query_exec_mode", "simple_protocol")
	u.RawQuery = q.Encode()
	_, err = cli.OpenStore(ctx, u.String(), 2, slog.New(slog.DiscardHandler))
	if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "client_encoding") {
		t.Fatalf("simple protocol on a SQL_ASCII session: %v (exit %d), want exit 2 saying client_encoding", err, cli.ExitCode(err))
	}
}

// TestCommandsRefuseUnfitDatabase: on a read-only database, or behind a
// pooler in statement mode (which refuses every transaction), the
// consumer, relay, replay and dlq -redrive exit 2 at start saying what is
// wrong, instead of starting and failing every batch or round.
func TestCommandsRefuseUnfitDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := cli.EnsureRelayStream(ctx, js, cli.DefaultRelayStream, cli.DefaultFollowUpPrefix, false); err != nil {
		t.Fatal(err)
	}
	migrated := func() string {
		dbURL := testenv.NewDatabase(t)
		if err := Migrate(ctx, nil, mapEnv(map[string]string{"DATABASE_URL": dbURL}), nil, io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
		return dbURL
	}
	readOnly := migrated()
	ru, _ := url.Parse(readOnly)
	admin, err := pgx.Connect(ctx, readOnly)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{strings.TrimPrefix(ru.Path, "/")}.Sanitize()+` SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	pooled := migrated()
	pu, _ := url.Parse(pooled)
	stmt := testenv.NewPgBouncer(t, testenv.PgBouncerOptions{PoolMode: "statement"})
	for _, db := range []struct{ name, url, says string }{
		{"read-only", readOnly, "read-only"},
		{"statement pooler", stmt.URL(strings.TrimPrefix(pu.Path, "/")), "statement"},
	} {
		env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": db.url})
		for _, c := range []struct {
			name string
			run  func(ctx context.Context) error
		}{
			{"consumer", func(ctx context.Context) error {
				return cli.Consumer(ctx, []string{"-http", ""}, env, io.Discard, io.Discard)
			}},
			{"relay", func(ctx context.Context) error {
				return Relay(ctx, []string{"-http", "", "-no-listen"}, env, nil, io.Discard, io.Discard)
			}},
			{"replay", func(ctx context.Context) error { return Replay(ctx, nil, env, nil, io.Discard, io.Discard) }},
			{"dlq -redrive", func(ctx context.Context) error {
				return Jetinbox(ctx, []string{"dlq", "-redrive", "-all"}, env, nil, io.Discard, io.Discard)
			}},
		} {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := c.run(rctx)
			cancel()
			if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), db.says) {
				t.Errorf("%s on a %s database: %v (exit %d), want exit 2 saying %q", c.name, db.name, err, cli.ExitCode(err), db.says)
			}
		}
	}
}
