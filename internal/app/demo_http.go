package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jetinbox/jetinbox/internal/chaos"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// demoHTTPDefault is the demo's -http default: on where a throwaway
// PostgreSQL can be started (the intake's keys and outbox live there).
func demoHTTPDefault() bool {
	_, err := testenv.FindPostgresBin()
	return err == nil
}

// demoHTTP runs the HTTP first hop, small: clients posting through a lossy
// proxy to two intake processes, never retrying, retrying without a key,
// with the same key, and in bursts, counted at the ledger.
func demoHTTP(ctx context.Context, stdout, progress io.Writer) error {
	fmt.Fprintln(stdout, "\nthe first hop over HTTP (jetinbox chaos -http, smaller): POST /v1/intents with an Idempotency-Key")
	res, err := chaos.RunHTTP(ctx, chaos.HTTPOptions{Intents: 100, DropRequest: 0.15, DropResponse: 0.15, Timeout: 30 * time.Millisecond,
		Burst: 6, Conflicts: 10, Kills: 1, Restarts: false, Seed: uint64(time.Now().UnixNano()), Progress: progress})
	if err != nil {
		return fmt.Errorf("demo -http: %w", err)
	}
	chaos.WriteHTTP(stdout, res)
	if !res.Clean() {
		return errors.New("demo -http: the same-key rows lost or duplicated, or an unsafe row showed nothing")
	}
	return nil
}
