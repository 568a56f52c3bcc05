// Package jsinbox wires the inbox to NATS JetStream.
//
//	proc, err := inbox.NewProcessor(pginbox.New(pool), handler, inbox.Config{Scope: "shipping"})
//	if err != nil {
//		return err
//	}
//	consumer, err := jsinbox.NewConsumer(js, proc, jsinbox.ConsumerConfig{})
//	if err != nil {
//		return err
//	}
//	go consumer.Run(ctx) // acks after COMMIT; pauses while the database is down
//
//	pub, err := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
//	_, err = pub.Publish(ctx, inbox.Intent{ID: "ship-42", Subject: "intents.shipping", Payload: body})
//
// Runnable examples, in the module's repository: the README's worker, a
// whole program (examples/worker), and ExampleConsumer
// (internal/servertest/jsinboxtest, with this package's other tests that
// need a nats-server, kept there so that an embedder's go.sum has none), run
// against a real nats-server and PostgreSQL.
//
// # Producing
//
// [EnsureStream] creates the intents stream with explicit limits and
// DiscardNew (a full stream refuses new intents, which the publisher retries,
// instead of deleting unconsumed ones), DenyDelete and DenyPurge, no rollup
// or per-message TTL headers, a dead-letter stream and an advisory stream
// beside it (see [AdvisoryStream]). It checks an existing stream and names
// every unsafe setting rather than changing it.
//
// A [Publisher] publishes [inbox.Intent] values with Nats-Msg-Id set to the
// intent's ID and Nats-Expected-Stream set to its stream (an intent whose
// subject another stream captures is refused, [ErrWrongStream]), keeps a
// bounded window of publishes in flight, and retries a publish that timed
// out, found no responders or hit a disconnect with the same ID after a
// jittered delay. JetStream drops the copy inside its duplicate window (the
// PubAck says duplicate), and the publisher reads the stored message back
// to check it carries the same subject and payload: another payload, or
// another subject, under the same ID is [inbox.ErrConflict]. After the window, the consumer's inbox catches copies.
//
// The publisher group-commits ([PublisherConfig].Batch): one group of
// intents is published at a time, and the intents handed over meanwhile,
// by one caller or by many goroutines, go out next as one JetStream atomic
// batch, which a stream with sync_interval: always stores with one fsync
// instead of one per intent. It never waits to fill a batch, and a small
// group goes as single publishes. [Publisher.Publish] returns each
// caller its own intent's PubAck or error; [Publisher.PublishAsync] hands an
// intent over and reports in Stats and Failures. A batch the stream refuses
// as a whole is published again one intent at a time, so deduplication and
// the conflict check stay per intent, and a stream that takes no atomic
// batches is published to one intent at a time.
//
// # Consuming
//
// A [Consumer] runs a durable pull consumer with explicit acks, a finite
// MaxDeliver and a bounded MaxAckPending. It forms batches from whatever has
// arrived (it never waits to fill one), runs several batches at once through
// an [inbox.Processor] on either store, and then, per message:
//
//   - applied or duplicate: Ack;
//   - rejected or conflict: publish a copy to the dead-letter stream (pinned
//     to it, with the reason and the original's own headers but none of
//     JetStream's), wait for the stream to store it, then TermWithReason; a
//     copy of an intent rejected before at another stream sequence is
//     terminated without a second dead letter;
//   - retry: NakWithDelay with a jittered delay chosen by delivery count (a
//     bare Nak would redeliver at once; the consumer's BackOff list does not
//     apply to naks); on the last delivery, dead-letter instead.
//
// A dead letter the stream refuses on a message's last delivery is held
// (InProgress) and retried until the stream takes it; the consumer is not
// [Consumer.Ready] meanwhile. A message the server gave up on after
// MaxDeliver (a crash on its last delivery) is announced by an advisory the
// advisory stream keeps whether or not a consumer listens; every consumer
// drains its durable's advisories and settles those messages. Only genuine
// advisories of the durable count; one for a message that aged out of the
// stream first is recorded in the dead-letter stream as [DeadLetterExpired].
// A consumer stopping while the database is down lets go of messages on
// their last delivery, for the next consumer to rescue.
//
// A batch that outlives half of AckWait sends InProgress. When the database is
// unreachable the consumer stops fetching and pings it, through the
// processor's store, with jittered backoff,
// so an outage does not become a redelivery storm. Several Consumer
// processes may share one durable: the inbox settles concurrent duplicates.
//
// # Checks
//
// [EnsureStream] and a Consumer refuse a stream or a durable under which
// an intent could be lost, mangled or applied twice, naming each unsafe
// setting ([CheckStream], [CheckConsumer]). A Consumer also warns at start
// about retry timing that works against its durable (MaxDeliver, BackOff,
// bare naks) and holds no intent its dead-letter stream could not take.
// The operator's checks (retry-timing lints, the horizon over which a
// message can come back, which `jetinbox prune` and `verify` hold the
// inbox's retention to) are the CLI's, not part of this API.
package jsinbox
