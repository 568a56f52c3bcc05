package chaos

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/idempotency/pgidempotency"
	"github.com/jetinbox/jetinbox/internal/intake"
	"github.com/jetinbox/jetinbox/jitter"
	"github.com/jetinbox/jetinbox/outbox"
	"github.com/jetinbox/jetinbox/outbox/pgoutbox"
)

// shardIntake is the HTTP first hop of a sharded run: an intake on a
// database of its own (not a shard's: a key must keep one home while its
// partition moves), its relay into the partitioned stream, and a client
// whose answers are lost at the run's -lose-puback rate, so it retries
// with the same key.
type shardIntake struct {
	srv    *httptest.Server
	pool   *pgxpool.Pool
	client *idempotency.Client
	stop   func()
}

const shardTenant = "shards"

// shardIntakeID is the ID the intake gives the intent posted with key.
func shardIntakeID(key string) string {
	return idempotency.Scope{Principal: shardTenant, Method: http.MethodPost, Route: intake.Route, Key: key}.ID()
}

func (r *shardRun) startIntake(ctx context.Context) (*shardIntake, error) {
	url, err := r.pgs[0].CreateDatabase(ctx, "intake")
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	if _, err := pgidempotency.New(pool).Migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := pgoutbox.New(pool).Migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	s, err := intake.NewPG(pool, intake.Config{Tenants: []intake.Tenant{{Name: shardTenant, TokenSHA256: intake.HashToken("shards-token")}},
		PartitionPrefix: r.m.Subject, Wait: 5 * time.Second})
	if err != nil {
		pool.Close()
		return nil, err
	}
	lossy := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if r.roll(r.o.LosePubAck) {
			r.fault("lost intake answers", 1)
			panic(http.ErrAbortHandler) // the answer never reaches the client
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	})
	srv := httptest.NewUnstartedServer(lossy)
	srv.Config.ErrorLog = nil
	srv.Start()
	rl, err := outbox.NewRelay(pgoutbox.New(pool), r.js, outbox.RelayConfig{Stream: r.m.Stream, Batch: 100,
		Idle: jitter.Policy{Kind: jitter.Decorrelated, Base: 10 * time.Millisecond, Cap: 100 * time.Millisecond}, Logger: r.log})
	if err != nil {
		srv.Close()
		pool.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = rl.Run(rctx) }()
	hc := &http.Client{Transport: &http.Transport{}}
	return &shardIntake{srv: srv, pool: pool,
		client: &idempotency.Client{HTTP: hc, Policy: jitter.Policy{Kind: jitter.Full, Base: time.Millisecond, Cap: 20 * time.Millisecond, MaxAttempts: 50}},
		stop:   func() { cancel(); <-done; hc.CloseIdleConnections(); srv.Close(); pool.Close() }}, nil
}

// post sends one intent with key until the intake answered 202.
func (si *shardIntake) post(ctx context.Context, key, subject string, payload []byte) error {
	body, _ := json.Marshal(intake.Body{Subject: subject, PayloadBase64: base64.StdEncoding.EncodeToString(payload)})
	res, err := si.client.Do(ctx, idempotency.Request{URL: si.srv.URL + intake.Route, Key: key, Body: body,
		Header: http.Header{"Authorization": {"Bearer shards-token"}, "Content-Type": {"application/json"}}})
	if err != nil {
		return fmt.Errorf("post %s: %w", key, err)
	}
	if res.Status != http.StatusAccepted {
		return fmt.Errorf("post %s: %d %s", key, res.Status, res.Body)
	}
	return nil
}

// drained waits until the intake's outbox has nothing pending.
func (si *shardIntake) drained(ctx context.Context) error {
	for {
		var n int
		if err := si.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE sent_at IS NULL AND failed IS NULL`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d intake outbox rows still pending: %w", n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
