package verify_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
	"github.com/jetinbox/jetinbox/outbox/sqliteoutbox"
)

// longParent is a parent ID too long for "notify:" + ID: its follow-up ID
// is the hashed long form.
var longParent = "long-" + strings.Repeat("x", 194)

// plantChain plants one parent per case of the chain check, in the
// dialect's SQL (exec runs one statement): a follow-up applied once, one
// published twice (after the duplicate window) and applied twice, one still
// pending in the outbox, one lost, one refused for good, a long parent whose
// follow-up is in the hashed form, and a follow-up nobody emitted. The
// stream gets its messages in an order that puts a copy and its first in
// different chunks when chunks are small.
func plantChain(t *testing.T, js jetstream.JetStream, exec func(q string, args ...any)) {
	t.Helper()
	ctx := context.Background()
	if _, err := jsinbox.EnsureStream(ctx, js, jsinbox.StreamConfig{Name: "NOTIFICATIONS", Subjects: []string{"notifications.>"}, DuplicateWindow: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	longID, err := outbox.FollowUpID(longParent, "notify")
	if err != nil || !strings.HasPrefix(longID, "notify:h") {
		t.Fatalf("long follow-up ID %q, %v", longID, err)
	}
	for _, p := range []string{"once", "twice", "waiting", "gone", "refused", longParent} {
		exec(`INSERT INTO inbox (scope, message_id, fingerprint) VALUES ('ledger', `+ph(1)+`, `+ph(2)+`)`, p, []byte{0})
	}
	exec(`INSERT INTO inbox (scope, message_id, fingerprint, status) VALUES ('ledger', 'rejected', `+ph(1)+`, 'rejected')`, []byte{0})
	for _, id := range []string{"notify:waiting", "notify:refused"} {
		exec(`INSERT INTO outbox (id, subject, payload, fingerprint) VALUES (`+ph(1)+`, 'notifications.1', `+ph(2)+`, `+ph(2)+`)`, id, []byte{0})
	}
	exec(`UPDATE outbox SET failed = 'another stream' WHERE id = 'notify:refused'`)
	for _, id := range []string{"notify:once", "notify:twice", longID} {
		exec(`INSERT INTO inbox (scope, message_id, fingerprint) VALUES ('notifications', `+ph(1)+`, `+ph(2)+`)`, id, []byte{0})
	}
	for _, id := range []string{"notify:once", "notify:twice", "notify:twice", longID} {
		exec(`INSERT INTO ledger_entries (scope, message_id, account, amount) VALUES ('notifications', `+ph(1)+`, 1, 1)`, id)
	}
	publish := func(id string) {
		t.Helper()
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "notifications.1", Data: []byte("{}"), Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}); err != nil {
			t.Fatal(err)
		}
	}
	publish("notify:twice")
	publish(longID)
	publish("notify:once")
	publish("notify:ghost")
	time.Sleep(500 * time.Millisecond) // past the duplicate window: a second copy is stored
	publish("notify:twice")
}

// ph is placeholder n; the SQLite side rewrites $n to ?n.
func ph(n int) string { return fmt.Sprintf("$%d", n) }

// wantChain is the report of the planted chain.
var wantChain = verify.ChainReport{Parents: 6, InStream: 4, Copies: 1, Pending: 1, Lost: 2, Unexpected: 1, NotApplied: 1, Duplicated: 1, AppliedOnce: 2}

func checkChain(t *testing.T, js jetstream.JetStream, db verify.DB) {
	t.Helper()
	for _, chunk := range []int{0, 1, 2, 3} {
		r, err := verify.Chain(context.Background(), js, db, verify.ChainOptions{Stream: "NOTIFICATIONS", Scope: "notifications", Ledger: true, ChunkSize: chunk})
		if err != nil {
			t.Fatal(err)
		}
		got, want := *r, wantChain
		got.Examples = nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("chunks of %d: chain report %+v\nwant %+v\nexamples: %q", chunk, got, want, r.Examples)
		}
		if r.Clean() {
			t.Fatal("a chain with a lost, a duplicated and an unexpected follow-up is clean")
		}
	}
}

// TestChainCountsEachCase: the planted chain on PostgreSQL, read in one
// chunk and in chunks of one, two and three IDs: every case is counted once,
// whichever chunk a copy, a parent or a follow-up falls in.
func TestChainCountsEachCase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := pipelinetest.New(t, jsinbox.StreamConfig{}, 4)
	if _, err := pgoutbox.New(e.Pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	plantChain(t, e.JS, func(q string, args ...any) {
		t.Helper()
		if _, err := e.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	})
	checkChain(t, e.JS, verify.Postgres(e.Pool))
}

// TestChainOnSQLite: the same planted chain in a SQLite file.
func TestChainOnSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sqliteinbox.Open(ctx, filepath.Join(t.TempDir(), "chain.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, m := range []func(context.Context, *sql.DB) (int, error){func(ctx context.Context, db *sql.DB) (int, error) { return sqliteinbox.New(db).Migrate(ctx) }, effects.MigrateSQLite, func(ctx context.Context, db *sql.DB) (int, error) { return sqliteoutbox.New(db).Migrate(ctx) }} {
		if _, err := m(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := nats.Connect(natsenv.NewNATS(t, natsenv.NATSOptions{}).URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	plantChain(t, js, func(q string, args ...any) {
		t.Helper()
		q = strings.NewReplacer("$1", "?1", "$2", "?2").Replace(q)
		if strings.HasPrefix(q, "INSERT INTO outbox") {
			q = strings.Replace(q, "(id, subject, payload, fingerprint)", "(id, subject, payload, fingerprint, created_at)", 1)
			q = strings.TrimSuffix(q, ")") + ", 0)"
		}
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	})
	checkChain(t, js, verify.SQLite(db))
}
