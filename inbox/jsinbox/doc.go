// Package jsinbox wires the inbox to NATS JetStream.
//
// # Producing
//
// [EnsureStream] creates the intents stream with explicit limits and
// DiscardNew (a full stream refuses new intents, which the publisher retries,
// instead of deleting unconsumed ones), DenyDelete and DenyPurge, no rollup
// or per-message TTL headers, and a dead-letter stream beside it. It checks
// an existing stream and names every unsafe setting rather than changing it.
//
// A [Publisher] publishes [Intent] values with Nats-Msg-Id set to the
// intent's ID, keeps a bounded window of publishes in flight, and retries a
// publish that timed out, found no responders or hit a disconnect with the
// same ID after a jittered delay. JetStream drops the copy inside its
// duplicate window (the PubAck says duplicate); after it, the consumer's
// inbox does.
//
// # Consuming
//
// A [Consumer] runs a durable pull consumer with explicit acks, a finite
// MaxDeliver and a bounded MaxAckPending. It forms batches from whatever has
// arrived (it never waits to fill one), runs several batches at once through
// an [inbox.Processor], and then, per message:
//
//   - applied or duplicate: Ack;
//   - rejected or conflict: publish to the dead-letter stream with the
//     reason and the original headers, wait for the stream to store it, then
//     TermWithReason;
//   - retry: NakWithDelay with a jittered delay chosen by delivery count (a
//     bare Nak would redeliver at once; the consumer's BackOff list does not
//     apply to naks); on the last delivery, dead-letter instead.
//
// A batch that outlives half of AckWait sends InProgress. When PostgreSQL is
// unreachable the consumer stops fetching and pings it with jittered backoff,
// so an outage does not become a redelivery storm. Several Consumer
// processes may share one durable: the inbox settles concurrent duplicates.
//
// # Checks
//
// Every check of a JetStream configuration lives here. [EnsureStream] and a
// Consumer refuse a stream or a durable under which an intent could be lost,
// mangled or applied twice, naming each unsafe setting ([CheckStream],
// [CheckConsumer]). [LintConsumer] and [LintPublisher] warn about retry
// timing that works against the durable (MaxDeliver, BackOff, bare naks) or
// against the stream's duplicate window. [ComputeHorizon] computes how long
// after an inbox row was written its message ID can still reach the inbox,
// which the inbox's retention must exceed; `jetinbox prune` refuses to prune
// inside it, and [CheckHorizons], for `jetinbox verify`, names the settings
// that break it.
package jsinbox
