package sqlitedelivery_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/delivery/sqlitedelivery"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
)

// An effect on a SQLite file decides a call in its own transaction; a
// dispatcher on the same file sends it with its idempotency key and
// records the answer.
func Example() {
	ctx := context.Background()
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	// The example's own receiver and file; a service uses its own.
	got := make(chan string, 1)
	rc := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get(delivery.HeaderID)
	}))
	defer rc.Close()
	dir, err := os.MkdirTemp("", "sqlitedelivery-example-")
	must(err)
	defer os.RemoveAll(dir)
	db, err := sqliteinbox.Open(ctx, filepath.Join(dir, "inbox.db"))
	must(err)
	defer db.Close()
	st := sqlitedelivery.New(db)
	_, err = st.Migrate(ctx)
	must(err)

	// In the effect's transaction (an inbox handler's *sql.Tx).
	tx, err := db.BeginTx(ctx, nil)
	must(err)
	must(sqlitedelivery.Add(ctx, tx, delivery.Intent{Scope: "orders", MessageID: "o-1", Endpoint: "billing", Payload: []byte(`{"order":1}`)}))
	must(tx.Commit())

	d, err := delivery.NewDispatcher(st, delivery.Config{Endpoints: []delivery.Endpoint{
		{Name: "billing", URL: rc.URL, KeyRetention: delivery.Duration(24 * time.Hour)},
	}})
	must(err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	key := <-got
	for {
		rows, err := st.List(ctx, delivery.StateDelivered, "billing", 10)
		must(err)
		if len(rows) == 1 {
			fmt.Println("delivered:", rows[0].LastStatus, "under the key sent:", rows[0].Key == key)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	must(<-done)
	fmt.Println("key of (scope, message ID, endpoint):", key == delivery.Key("orders", "o-1", "billing"))
	// Output:
	// delivered: 200 under the key sent: true
	// key of (scope, message ID, endpoint): true
}
