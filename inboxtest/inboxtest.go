// Package inboxtest runs a handler's batches through a real inbox
// processor on a temporary store, in a plain go test: no NATS, no
// database server of your own for SQLite. It shows what the inbox does
// with each message (applied, duplicate, conflict, rejected, retry) and
// that a failing effect leaves nothing behind.
//
//	kit, err := inboxtest.SQLite(myHandler, inbox.Config{Scope: "emails"})
//	if err != nil {
//		t.Fatal(err)
//	}
//	defer kit.Close()
//	out, err := kit.Deliver(ctx, inboxtest.Message("m-1", `{"to":"ann@example.com"}`))
//	// inboxtest.Statuses(out) == "applied"; deliver it again: "duplicate"
//
// A handler written for PostgreSQL (pgx.Tx) runs on a schema of its own in
// a test database, dropped when the test ends:
//
//	kit := inboxtest.Postgres(t, os.Getenv("DATABASE_URL"), myHandler, inbox.Config{Scope: "emails"})
//	_, err := kit.Pool.Exec(ctx, `CREATE TABLE sent (id text PRIMARY KEY)`) // in the kit's schema
//
// [New] runs a handler on any store of your own.
package inboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
)

// Kit runs batches through a processor on one store, the way a consumer
// would deliver them.
type Kit[TX any] struct {
	proc *inbox.Processor[TX]

	mu  sync.Mutex
	seq uint64
}

// New returns a kit running handler on store (for example
// pginbox.New(pool) on a test database), migrating the inbox tables first
// when the store can. cfg is the processor's configuration; Scope is
// required.
func New[TX any](store driver.Store[TX], handler inbox.Handler[TX], cfg inbox.Config) (*Kit[TX], error) {
	if m, ok := store.(interface {
		Migrate(ctx context.Context) (int, error)
	}); ok {
		if _, err := m.Migrate(context.Background()); err != nil {
			return nil, fmt.Errorf("inboxtest: migrate: %w", err)
		}
	}
	proc, err := inbox.NewProcessor(store, handler, cfg)
	if err != nil {
		return nil, fmt.Errorf("inboxtest: %w", err)
	}
	return &Kit[TX]{proc: proc}, nil
}

// Processor returns the kit's processor.
func (k *Kit[TX]) Processor() *inbox.Processor[TX] { return k.proc }

// Deliver hands msgs to the processor as one batch, the way a consumer
// delivers what has arrived, and returns one outcome per message. Fields
// left zero are filled in as a stream would: Subject "intents.test",
// StreamSeq the next sequence, Deliveries 1. An error means the batch as a
// whole could not commit (the outcomes are then retries).
func (k *Kit[TX]) Deliver(ctx context.Context, msgs ...inbox.Message) ([]inbox.Outcome, error) {
	k.mu.Lock()
	batch := make([]inbox.Message, len(msgs))
	for i, m := range msgs {
		if m.Subject == "" {
			m.Subject = "intents.test"
		}
		if m.StreamSeq == 0 {
			k.seq++
			m.StreamSeq = k.seq
		}
		if m.Deliveries == 0 {
			m.Deliveries = 1
		}
		batch[i] = m
	}
	k.mu.Unlock()
	return k.proc.Process(ctx, batch)
}

// Message returns a message with id and payload, as a producer would
// publish it.
func Message(id, payload string) inbox.Message {
	return inbox.Message{ID: id, Payload: []byte(payload)}
}

// Statuses returns the statuses of out, space-separated: "applied
// duplicate conflict rejected retry".
func Statuses(out []inbox.Outcome) string {
	s := make([]string, len(out))
	for i, o := range out {
		s[i] = o.Status.String()
	}
	return strings.Join(s, " ")
}

// Temp is a [Kit] on a SQLite file in a temporary directory, which
// Close removes. [SQLite] makes one.
type Temp struct {
	*Kit[*sql.Tx]
	// DB is the store's database: create the handler's tables in it, and
	// read what the handler wrote. Do not use it while Deliver runs.
	DB  *sql.DB
	dir string
}

// SQLite returns a kit running handler on a new, migrated SQLite
// inbox in a temporary directory. Close it when done.
func SQLite(handler inbox.Handler[*sql.Tx], cfg inbox.Config) (*Temp, error) {
	dir, err := os.MkdirTemp("", "inboxtest-")
	if err != nil {
		return nil, fmt.Errorf("inboxtest: %w", err)
	}
	db, err := sqliteinbox.Open(context.Background(), filepath.Join(dir, "inbox.db"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("inboxtest: %w", err)
	}
	k, err := New(sqliteinbox.New(db), handler, cfg)
	if err != nil {
		_ = db.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &Temp{Kit: k, DB: db, dir: dir}, nil
}

// Close closes the database and removes its directory.
func (k *Temp) Close() error {
	return errors.Join(k.DB.Close(), os.RemoveAll(k.dir))
}
