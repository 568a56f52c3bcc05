package console_test

import (
	"context"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/console"
)

// The console mounted under /console in a service's own mux, reading as the
// verifier (its database role and NATS user): read-only, since no operator
// credential and no re-drive role are given.
func ExampleNew() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL, nats.UserCredentials("verifier.creds"))
	if err != nil {
		log.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	pool, err := pgxpool.New(ctx, "postgres://jetinbox_verifier@db:5432/jetinbox?sslmode=verify-full")
	if err != nil {
		log.Fatal(err)
	}
	h, err := console.New(console.Config{Prefix: "/console", JS: js, ReadPG: pool})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", h)
	log.Fatal(http.ListenAndServe("127.0.0.1:8089", mux))
}
