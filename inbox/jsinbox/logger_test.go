package jsinbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
)

// TestConsumerTakesItsOwnLogger: a consumer's Logger and TracerProvider
// are set in its own config, as on every other component; left nil, they
// are the processor's.
func TestConsumerTakesItsOwnLogger(t *testing.T) {
	ctx := context.Background()
	db, err := sqliteinbox.Open(ctx, filepath.Join(t.TempDir(), "inbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	h := inbox.HandlerFunc(func(context.Context, *sql.Tx, inbox.Message) error { return nil })
	procLog := slog.New(slog.DiscardHandler)
	proc, err := inbox.NewProcessor(sqliteinbox.New(db), h, inbox.Config{Scope: "s", Logger: procLog})
	if err != nil {
		t.Fatal(err)
	}
	own, tp := slog.New(slog.DiscardHandler), noop.NewTracerProvider()
	c, err := jsinbox.NewConsumer(nil, proc, jsinbox.ConsumerConfig{Logger: own, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Config(); got.Logger != own || got.TracerProvider != tp {
		t.Errorf("consumer's Logger %p, TracerProvider %v; want its own %p, %v", got.Logger, got.TracerProvider, own, tp)
	}
	c, err = jsinbox.NewConsumer(nil, proc, jsinbox.ConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Config().Logger; got != procLog {
		t.Errorf("consumer without a Logger logs to %p, want the processor's %p", got, procLog)
	}
}
