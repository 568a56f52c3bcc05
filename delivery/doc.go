// Package delivery is the last hop: an effect that calls another service
// (a webhook, a payment or email API) decides the call once and a
// dispatcher makes it until its outcome is known.
//
//	err := pgdelivery.Add(ctx, tx, delivery.Intent{Scope: scope, MessageID: id, Endpoint: "billing", Payload: body}) // in the inbox transaction
//	eps, err := delivery.LoadEndpoints("endpoints.json")                                                               // URLs, secrets, retention
//	d, err := delivery.NewDispatcher(pgdelivery.New(pool), delivery.Config{Endpoints: eps})
//	err = d.Run(ctx) // or: jetinbox deliver -endpoints endpoints.json
//
// On SQLite, package sqlitedelivery is the same with the batch's *sql.Tx:
// sqlitedelivery.Add in the effect, sqlitedelivery.New(db) for the
// dispatcher.
//
// Calling from the handler is unsound both ways: a rollback after the call,
// or a crash between the call and the commit, calls again with nothing to
// recognise the repeat by. Instead the effect adds a delivery row in its own
// transaction (the same one that holds the inbox row), so the call is
// decided if and only if the effect commits. A [Dispatcher] leases due rows
// (a lease with an expiry, so the rows of a dispatcher that dies come back),
// POSTs each with Idempotency-Key and the Standard Webhooks headers
// (webhook-id = the key, webhook-timestamp, webhook-signature: HMAC-SHA256
// under every configured secret at once, for rotation), records the answer
// (status, the first bytes of the body, when) and marks the row.
//
// # Outcomes
//
// The key is [Key](scope, message ID, endpoint): the same on every attempt,
// in every dispatcher, after every redrive, and never truncated (an
// endpoint whose key_max_len or key_charset would not take it is a
// configuration error at start).
//
//   - 2xx: delivered.
//   - 4xx other than 408, 409, 425 and 429, and 3xx (redirects are never
//     followed): refused for good; dead-lettered with the answer, to be
//     redriven (`jetinbox dlq -deliveries -redrive`) with the same key
//     after the cause is fixed.
//   - no answer (a timeout, a reset after sending), 5xx, 408, 409, 425,
//     429: the outcome is unknown, never "not done": retried under the
//     same key after a jittered wait (a longer Retry-After wins).
//   - past the endpoint's key retention (time since the first attempt) a
//     retry could reach a receiver that forgot the key: the row is
//     dead-lettered "outcome unknown: reconcile" instead, never retried
//     under a new key.
//
// # A receiver that recovers is not stormed
//
// Each endpoint has its own loop, concurrency limit and circuit breaker,
// so a slow or hung endpoint holds only its own slots. A breaker opens
// after consecutive failures and stays open for a jittered, growing time,
// then lets one probe through; dispatchers whose breakers opened together
// probe at different moments, and rows that failed together come back at
// their own jittered retry times, at most Concurrency at once.
//
// # Receivers
//
// A receiver stores the key (webhook-id) with its answer in the transaction
// of its effect and answers a repeat with the stored answer: package
// idempotency does (see its Webhooks option), and docs/receivers.md says
// how in any language.
package delivery
