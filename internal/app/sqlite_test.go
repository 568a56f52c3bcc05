package app

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// TestCommandsOnSQLite: migrate, accounts, the consumer, verify, replay and
// prune take a SQLite file by URL, DATABASE_URL=sqlite:///path or -store,
// and keep the guarantee there: a replay after an inbox row vanished
// applies the message again only with -apply, and verify then reports it.
func TestCommandsOnSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{})
	path := filepath.Join(t.TempDir(), "inbox.db")
	dbURL := "sqlite://" + path
	env := mapEnv(map[string]string{"NATS_URL": srv.URL(), "DATABASE_URL": dbURL})

	var out bytes.Buffer
	if err := Migrate(ctx, nil, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "applied 1 inbox, 1 ledger and 2 outbox migrations") {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := Migrate(ctx, []string{"-status", "-store", dbURL}, mapEnv(nil), nil, &out, io.Discard); err != nil || strings.Count(out.String(), "applied") != 4 {
		t.Fatalf("migrate -status -store: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := Migrate(ctx, []string{"-print", "-store", dbURL}, mapEnv(nil), nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "WITHOUT ROWID") {
		t.Fatalf("migrate -print for SQLite: %v\n%s", err, out.String())
	}
	js := openAccountsAndStream(t, env, srv.URL())
	if err := cli.Producer(ctx, []string{"-count", "300", "-prefix", "sq"}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	consumeSettled(t, env, js)

	out.Reset()
	if err := Verify(ctx, []string{"-json"}, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), `"applied_once": 300`) {
		t.Fatalf("verify -json on SQLite: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := Replay(ctx, nil, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "duplicates (no effect)   300") {
		t.Fatalf("replay on SQLite: %v\n%s", err, out.String())
	}
	db, err := sqliteinbox.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`DELETE FROM inbox WHERE message_id = 'sq-7'`); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = Replay(ctx, nil, env, nil, &out, io.Discard)
	if cli.ExitCode(err) != 1 || !strings.Contains(out.String(), "would apply              1") {
		t.Fatalf("dry-run replay over a missing row: %v (exit %d)\n%s", err, cli.ExitCode(err), out.String())
	}
	if n := sqliteEntries(t, db); n != 300 {
		t.Fatalf("a dry-run replay changed the ledger: %d entries, want 300", n)
	}
	if err := Replay(ctx, []string{"-apply"}, env, nil, io.Discard, io.Discard); cli.ExitCode(err) != 1 {
		t.Fatalf("replay -apply: %v", err)
	}
	out.Reset()
	err = Verify(ctx, nil, env, nil, &out, io.Discard)
	if cli.ExitCode(err) != 1 || !regexp.MustCompile(`(?m)^ *duplicated +1 +VIOLATION`).MatchString(out.String()) {
		t.Fatalf("verify after a double apply on SQLite: %v (exit %d)\n%s", err, cli.ExitCode(err), out.String())
	}
	// Prune reads the horizon from the server, then deletes on SQLite.
	if _, err := db.Exec(`UPDATE inbox SET received_at = received_at - 40 * 86400 * 1000000 WHERE message_id LIKE 'sq-1%'`); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Prune(ctx, []string{"-older-than", "800h", "-dlq-redrive=false"}, env, nil, &out, io.Discard); err != nil || !strings.Contains(out.String(), "pruned 111 inbox rows") {
		t.Fatalf("prune on SQLite: %v\n%s", err, out.String())
	}
	// A URL that names no file is a usage error.
	if err := Migrate(ctx, []string{"-store", "sqlite://"}, mapEnv(nil), nil, io.Discard, io.Discard); cli.ExitCode(err) != 2 {
		t.Fatalf("migrate -store sqlite://: %v (exit %d), want 2", err, cli.ExitCode(err))
	}
	if err := Migrate(ctx, []string{"-store", "sqlite://" + filepath.Join(t.TempDir(), "no", "such", "dir.db")}, mapEnv(nil), nil, io.Discard, io.Discard); cli.ExitCode(err) != 2 {
		t.Fatalf("migrate on a path that cannot be opened: %v (exit %d), want 2", err, cli.ExitCode(err))
	}
}

func sqliteEntries(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM ledger_entries`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// openAccountsAndStream opens accounts 1–1024 in env's database and
// creates the intents stream on the server at url, as an operator does
// before the first consumer starts; it returns a JetStream handle on a
// connection the test closes at its end.
func openAccountsAndStream(t *testing.T, env cli.Env, url string) jetstream.JetStream {
	t.Helper()
	ctx := context.Background()
	if err := Accounts(ctx, []string{"-open", "1-1024"}, env, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	return js
}
