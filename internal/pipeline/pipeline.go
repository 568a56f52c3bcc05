// Package pipeline holds what the demo, the benchmarks and the tests share to
// set up and drive a producer → JetStream → inbox consumer pipeline.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
)

// Setup migrates the inbox and ledger schemas, creates accounts 1..accounts and
// makes sure the intents stream and its dead-letter stream exist.
func Setup(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, stream jsinbox.StreamConfig, accounts int) error {
	if _, err := pginbox.New(pool).Migrate(ctx); err != nil {
		return err
	}
	if _, err := effects.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := effects.SeedAccounts(ctx, pool, accounts); err != nil {
		return err
	}
	if _, err := jsinbox.EnsureStream(ctx, js, stream); err != nil {
		return err
	}
	return nil
}

// Load describes generated intents.
type Load struct {
	// Count of distinct intents.
	Count int
	// Accounts the amounts spread over (1..Accounts). HotAccount puts every
	// intent on account 1 instead.
	Accounts   int
	HotAccount bool
	// Prefix makes IDs unique per run: "<prefix>-<n>".
	Prefix string
	// Subject prefix; intents go to "<Subject>.<account>". Default "intents".
	Subject string
	// Seed for amounts and accounts.
	Seed uint64
	// PayloadPad adds a JSON-whitespace tail to every payload, to measure
	// bigger messages. Default 0.
	PayloadPad int
}

// Generate returns the intents of a load. IDs are chosen here, once, so that
// every publish retry carries the same one.
func Generate(l Load) []inbox.Intent {
	if l.Accounts <= 0 {
		l.Accounts = 1
	}
	if l.Subject == "" {
		l.Subject = "intents"
	}
	r := rand.New(rand.NewPCG(l.Seed, 0x6a6574696e626f78))
	out := make([]inbox.Intent, l.Count)
	for i := range out {
		acct := int64(1)
		if !l.HotAccount {
			acct = 1 + r.Int64N(int64(l.Accounts))
		}
		in := effects.Intent{Account: acct, Amount: 1 + r.Int64N(10_000)}
		p := in.AppendJSON(make([]byte, 0, 40+l.PayloadPad))
		for range l.PayloadPad {
			p = append(p, ' ')
		}
		out[i] = inbox.Intent{
			ID:      l.Prefix + "-" + strconv.Itoa(i),
			Subject: l.Subject + "." + strconv.FormatInt(acct%16, 10),
			Payload: p,
		}
	}
	return out
}

// WaitSettled waits until the durable consumer has nothing pending and
// nothing awaiting an ack, its delivered sequence reached the stream's
// last sequence, and every max-deliveries advisory of the durable was
// settled (its messages rescued).
func WaitSettled(ctx context.Context, js jetstream.JetStream, stream, durable string, progress func(settled, total uint64)) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		settled, err := settledOnce(ctx, js, stream, durable, progress)
		if settled {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pipeline: waiting for %s/%s to settle: %w (last error: %v)", stream, durable, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// settledOnce asks once whether the durable has settled the stream. Each
// look has a timeout of its own: on a cluster right after a fault, a
// request can be dropped, and it must not hold the whole wait.
func settledOnce(ctx context.Context, js jetstream.JetStream, stream, durable string, progress func(settled, total uint64)) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return false, err
	}
	c, err := s.Consumer(ctx, durable)
	if err != nil {
		return false, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, err
	}
	last := s.CachedInfo().State.LastSeq
	if si, err := s.Info(ctx); err == nil {
		last = si.State.LastSeq
	}
	if progress != nil {
		progress(info.AckFloor.Stream, last)
	}
	return info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream >= last && rescued(ctx, js, stream, durable), nil
}

// rescued reports whether the durable's rescue consumer on the advisory
// stream, if there is one, has settled every advisory.
func rescued(ctx context.Context, js jetstream.JetStream, stream, durable string) bool {
	c, err := js.Consumer(ctx, jsinbox.AdvisoryStream(stream), durable)
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		return true
	}
	if err != nil {
		return false
	}
	info, err := c.Info(ctx)
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}
