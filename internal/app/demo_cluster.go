package app

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
	"github.com/jetinbox/jetinbox/internal/verify"
	"github.com/jetinbox/jetinbox/jitter"
)

// clusterRetry times the demo producer's retries on a cluster. A killed
// leader is replaced after the followers' election timeout, several
// seconds in which every publish times out or finds no responder: a
// budget of a few hundred milliseconds (the one-node demo's) gives up on
// those intents. Production's default budget is 100 s.
var clusterRetry = jitter.Policy{Kind: jitter.Full, Base: 50 * time.Millisecond, Cap: time.Second, MaxElapsed: time.Minute}

// demoSetup is pipeline.Setup; on a fresh cluster it retries while the
// meta group is still placing the first R3 stream.
func demoSetup(ctx context.Context, js jetstream.JetStream, store *cli.Store, stream jsinbox.StreamConfig, accounts int, cluster bool) error {
	if !cluster {
		return setupStore(ctx, js, store, stream, accounts)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := setupStore(actx, js, store, stream, accounts)
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// killStreamLeader kills the node leading stream (no leadership handed
// over) while the producer goes on publishing, waits until the other two elected a new leader, and
// starts the node again once its replicas caught up. The channel gets the
// outcome.
func killStreamLeader(ctx context.Context, nodes *natsenv.Cluster, stream string, say func(string, ...any)) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			l, err := nodes.WaitStreamLeader(wctx, stream)
			if err != nil {
				return err
			}
			t0 := time.Now()
			nodes.Kill(l)
			say("killed %s, the leader of stream %s, halfway through publishing", nodes.Name(l), stream)
			nl, err := nodes.WaitStreamLeader(wctx, stream)
			if err != nil {
				return err
			}
			say("%s leads %s now (elected in %v); the producer retries with the same IDs", nodes.Name(nl), stream, time.Since(t0).Round(time.Millisecond))
			if err := nodes.Start(l); err != nil {
				return fmt.Errorf("demo: restart %s: %w", nodes.Name(l), err)
			}
			if err := nodes.WaitHealthy(wctx); err != nil {
				return err
			}
			say("%s restarted and caught up", nodes.Name(l))
			return nil
		}()
	}()
	return done
}

// waitDurable waits until the consumers' durable has a leader and every
// node is healthy: the leader kill is meant to meet a working pipeline, not
// one still being set up.
func waitDurable(ctx context.Context, nodes *natsenv.Cluster, stream, durable string) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := nodes.WaitConsumerLeader(wctx, stream, durable); err != nil {
		return err
	}
	return nodes.WaitHealthy(wctx)
}

// demoVerify is verify.Run. On a cluster, a read that times out (a
// replica still settling after the kill) is
// tried again once every node is healthy: a failed read judges nothing.
func demoVerify(ctx context.Context, nodes *natsenv.Cluster, js jetstream.JetStream, db verify.DB, o verify.Options, say func(string, ...any)) (rep *verify.Report, err error) {
	err = nodes.ReadWhenHealthy(ctx, func() (err error) {
		rep, err = verify.RunOn(ctx, js, db, o)
		return err
	}, func(err error) { say("verify could not read the streams (%v); again", err) })
	return rep, err
}
