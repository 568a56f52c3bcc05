// Package jitter computes retry delays that spread clients apart: when many clients fail at
// the same moment (a server restarts, a database fails over), retries that follow the same
// schedule arrive together and knock the recovering server over again. Jitter draws each delay
// at random so that they do not.
//
// # Policies
//
// A Policy is a plain config struct: a Kind (None, Full, Equal or Decorrelated; the formulas of
// the AWS Architecture Blog's "Exponential Backoff And Jitter"), Base and Cap durations and two
// optional budgets. Every field documents its default and what zero means; WithDefaults fills
// them in and Validate checks the result. Default returns the policy the project uses, chosen by
// simulating many clients that fail at once against an overloaded server (see [Default]).
//
// Unlike backoff.ExponentialBackOff, a Policy never gives up on its own: zero MaxAttempts and
// zero MaxElapsed mean no limit. Set them where giving up is right, and check with Horizon how
// long the retries can last.
//
// # Retry loops
//
// Policy.NewBackOff returns a github.com/cenkalti/backoff/v4 BackOff, so the whole of that
// package (Retry, RetryNotify, WithContext, tickers) works with it:
//
//	err := backoff.Retry(publish, backoff.WithContext(jitter.Default().NewBackOff(), ctx))
//
// # Nak delays
//
// A JetStream consumer does not keep a BackOff per message; it knows how often the message was
// delivered. Policy.Delay computes a delay from that number alone:
//
//	msg.NakWithDelay(policy.Delay(int(meta.NumDelivered)))
//
// A bare Nak redelivers at once, and a consumer's BackOff list is the same fixed schedule for
// every client and does not apply to naks at all; jetinbox's consumer warns so at start, along
// with the other hazards of a consumer's retry settings, and the producer of a producer's.
// LintPolicy checks a policy on its own: invalid, or without jitter.
//
// # Randomness
//
// Delays come from math/rand/v2's global generator, which is safe for concurrent use without a
// lock. Tests set Policy.Rand to a seeded source to get the same delays every run.
package jitter
