// Package idempotency makes an HTTP endpoint safe to retry: a client sends
// an Idempotency-Key with its POST, and however often the request arrives
// (a lost response, a timeout, a second process behind the load balancer
// serving the retry), the handler's work commits once and every repeat gets
// the first answer back, marked Idempotent-Replayed: true.
//
// It follows the IETF httpapi draft "The Idempotency-Key HTTP Header Field"
// and the behaviour clients know from Stripe:
//
//   - the key is the header's sf-string ("…") or a bare value, 1 to
//     [MaxKeyLen] characters of letters, digits and -_.:~+/=; a malformed
//     key, or none on a route that requires one, is refused with 400 and an
//     application/problem+json body;
//   - a key is scoped by the authenticated principal, the method and the
//     route ([Scope]), so one tenant can neither read nor collide with
//     another's answers;
//   - the fingerprint ([Fingerprint]) covers the method, the route, the body
//     and the request headers the route names; the same key with another
//     fingerprint gets 422 naming what differs;
//   - the key is claimed with INSERT … ON CONFLICT DO NOTHING in the same
//     database transaction the handler does its work in (the handler gets
//     the transaction, as an inbox handler does), and the answer is stored
//     in it: a crash anywhere leaves nothing (the retry runs) or everything
//     (the retry replays);
//   - a duplicate that arrives while the first is running, in this process
//     or another, waits for the first one's transaction (its claim blocks on
//     the key's row) for at most [Config.Wait] and shares its answer; past
//     the bound it gets 409 with Retry-After. Nothing runs twice, and no
//     "in progress" marker outlives a dead process: the claim is a row lock
//     of an open transaction, which ends with its connection;
//   - only terminal answers are stored: 2xx and the 4xx the handler decided.
//     408, 429, 5xx, a handler error (one marked [Retryable] answers 503)
//     and a transaction that did not commit roll the work back, so the
//     retry runs it;
//   - keys are kept at least [DefaultRetention] (24 hours), and a store's
//     Prune deletes older ones in bounded batches, refusing a horizon
//     shorter than the retention it is told.
//
// The stores are in pgidempotency (PostgreSQL, pgx.Tx) and
// sqliteidempotency (SQLite, *sql.Tx), behind one conformance suite. The
// [Client] is the other side: one key per intent, retries with jittered
// backoff, Retry-After honoured, no retry of other 4xx, and
// [ErrOutcomeUnknown] when it gave up without an answer.
package idempotency
