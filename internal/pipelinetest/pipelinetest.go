// Package pipelinetest starts what most of the project's integration tests
// share: an embedded nats-server, a throwaway database with the inbox and
// ledger schemas and some accounts, a pool and a JetStream client on them,
// and the streams. Only tests import it.
package pipelinetest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// Env is a running pipeline's servers and clients. Everything is closed
// when the test ends.
type Env struct {
	NATS  *natsenv.NATS
	DBURL string
	Pool  *pgxpool.Pool
	NC    *nats.Conn
	JS    jetstream.JetStream
}

// New starts a nats-server and a database, migrates the schemas, opens
// accounts 1..accounts and creates the streams stream describes.
func New(t testing.TB, stream jsinbox.StreamConfig, accounts int) *Env {
	t.Helper()
	e := Start(t)
	if err := pipeline.Setup(context.Background(), e.JS, e.Pool, stream, accounts); err != nil {
		t.Fatal(err)
	}
	return e
}

// Start starts a nats-server and an empty database and connects to both;
// the caller sets them up (pipeline.Setup, or the commands under test).
func Start(t testing.TB) *Env {
	t.Helper()
	ctx := context.Background()
	e := &Env{NATS: natsenv.NewNATS(t, natsenv.NATSOptions{}), DBURL: testenv.NewDatabase(t)}
	var err error
	if e.Pool, err = pginbox.NewPool(ctx, e.DBURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Pool.Close)
	if e.NC, err = nats.Connect(e.NATS.URL()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.NC.Close)
	if e.JS, err = jetstream.New(e.NC); err != nil {
		t.Fatal(err)
	}
	return e
}

// CopiesByID reads the whole stream and counts its messages per message ID,
// so a test can say that every ID is there once.
func CopiesByID(t testing.TB, js jetstream.JetStream, stream string) map[string]int {
	t.Helper()
	msgs, err := verify.ReadStream(context.Background(), js, stream)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int, len(msgs))
	for _, m := range msgs {
		out[m.ID]++
	}
	return out
}
