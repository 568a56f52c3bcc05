package jitter_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/jetinbox/jetinbox/jitter"
)

// A BackOff from NewBackOff hands out jittered delays, then backoff.Stop once MaxAttempts
// retries were used. The seeded Rand makes the output reproducible; leave it nil in
// production.
func ExamplePolicy_NewBackOff() {
	p := jitter.Policy{
		Kind:        jitter.Decorrelated,
		Base:        100 * time.Millisecond,
		Cap:         2 * time.Second,
		MaxAttempts: 6,
		Rand:        rand.New(rand.NewPCG(1, 2)).Float64,
	}
	b := p.NewBackOff()
	for {
		d := b.NextBackOff()
		if d == backoff.Stop {
			fmt.Println("stop")
			break
		}
		fmt.Println(d.Round(time.Millisecond))
	}
	// Output:
	// 235ms
	// 380ms
	// 628ms
	// 867ms
	// 2s
	// 2s
	// stop
}

// The BackOff plugs into the rest of cenkalti/backoff, here backoff.Retry: the operation runs
// once and is retried MaxAttempts times.
func ExamplePolicy_NewBackOff_retry() {
	p := jitter.Policy{Base: time.Millisecond, Cap: 5 * time.Millisecond, MaxAttempts: 3}
	calls := 0
	err := backoff.Retry(func() error {
		calls++
		return errors.New("server unavailable")
	}, p.NewBackOff())
	fmt.Println(calls, err)
	// Output: 4 server unavailable
}

// A consumer naks by delivery count: msg.NakWithDelay(p.Delay(int(meta.NumDelivered))).
func ExamplePolicy_Delay() {
	p := jitter.Policy{Kind: jitter.Full, Rand: rand.New(rand.NewPCG(1, 2)).Float64}
	for delivered := 1; delivered <= 5; delivered++ {
		fmt.Printf("delivery %d failed: nak with delay %v\n", delivered, p.Delay(delivered).Round(time.Millisecond))
	}
	// Output:
	// delivery 1 failed: nak with delay 68ms
	// delivery 2 failed: nak with delay 92ms
	// delivery 3 failed: nak with delay 203ms
	// delivery 4 failed: nak with delay 344ms
	// delivery 5 failed: nak with delay 1.276s
}

func ExampleDefault() {
	p := jitter.Default()
	h, _ := p.Horizon()
	fmt.Println(p.Kind, p.Base, p.Cap, p.MaxAttempts, p.MaxElapsed)
	fmt.Println("longest waiting before giving up:", h)
	// Output:
	// decorrelated 100ms 10s 10 0s
	// longest waiting before giving up: 1m12s
}

func ExampleParseKind() {
	k, err := jitter.ParseKind("equal")
	fmt.Println(k, err)
	_, err = jitter.ParseKind("random")
	fmt.Println(err)
	// Output:
	// equal <nil>
	// jitter: invalid policy: unknown kind "random" (want none, full, equal or decorrelated)
}

func ExampleLintPolicy() {
	for _, w := range jitter.LintPolicy("PublishRetry", jitter.Policy{Kind: jitter.None, MaxAttempts: 5}) {
		fmt.Println("-", w)
	}
	// Output:
	// - PublishRetry uses no jitter: every client that failed at the same moment retries at the same moments; use Decorrelated (the default) or Full
}
