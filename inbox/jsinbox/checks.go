// The configuration checks: settings of a stream or a durable under which
// an intent could be lost, mangled or applied twice (errors), and retry
// timings of a consumer or a producer that work against the stream or the
// durable (warnings).

package jsinbox

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// CheckConsumer lists the settings of a durable that break the guarantee.
func CheckConsumer(c jetstream.ConsumerConfig) []string {
	var p []string
	if c.AckPolicy != jetstream.AckExplicitPolicy {
		p = append(p, "ack policy is not explicit: messages would count as done before their transaction commits")
	}
	if c.MaxDeliver < 1 {
		p = append(p, "MaxDeliver is unlimited: a message that keeps failing is never dead-lettered")
	}
	if c.MaxAckPending < 1 {
		p = append(p, "MaxAckPending is unlimited: memory grows with the backlog")
	}
	return p
}

// checkDeadLetter: dead letters are the record of what was rejected and
// why: they survive a restart and age out, nobody deletes or purges them
// (jetinbox dlq reads and re-drives them without deleting any).
func checkDeadLetter(c jetstream.StreamConfig) []string {
	var p []string
	if c.Storage != jetstream.FileStorage {
		p = append(p, "storage is not file: a restart loses every dead letter")
	}
	if !c.DenyDelete {
		p = append(p, "DenyDelete is off: single dead letters can be deleted")
	}
	if !c.DenyPurge {
		p = append(p, "DenyPurge is off: the dead letters can be purged")
	}
	return p
}

// CheckStream lists the settings of an existing stream that could lose or
// mangle intents.
func CheckStream(c jetstream.StreamConfig, window time.Duration) []string {
	var p []string
	if c.Storage != jetstream.FileStorage {
		p = append(p, "storage is not file: a restart loses every intent")
	}
	if c.Discard != jetstream.DiscardNew {
		p = append(p, "discard policy is old: a full stream silently deletes unconsumed intents (use DiscardNew)")
	}
	if c.MaxMsgs <= 0 && c.MaxBytes <= 0 {
		p = append(p, "no MaxMsgs or MaxBytes limit: the stream grows until the disk is full")
	}
	if !c.DenyDelete {
		p = append(p, "DenyDelete is off: single intents can be deleted")
	}
	if !c.DenyPurge {
		p = append(p, "DenyPurge is off: the stream can be purged")
	}
	if c.AllowRollup {
		p = append(p, "rollup headers allowed: a Nats-Rollup header deletes earlier intents")
	}
	if c.AllowMsgTTL {
		p = append(p, "per-message TTL allowed: a Nats-TTL header expires an intent before it is consumed")
	}
	if c.Retention != jetstream.LimitsPolicy {
		p = append(p, "retention is not limits: an interest or work-queue stream removes intents once another consumer acks them, so replay and verify cannot see them")
	}
	if c.MaxMsgsPerSubject > 0 && !c.DiscardNewPerSubject {
		p = append(p, "MaxMsgsPerSubject without DiscardNewPerSubject: a busy subject silently drops its oldest unconsumed intents")
	}
	if c.Duplicates < window {
		p = append(p, fmt.Sprintf("duplicate window %v is shorter than the producer's retry horizon %v", c.Duplicates, window))
	}
	return p
}

// checkAdvisory: advisories must survive a restart and be kept.
func checkAdvisory(c jetstream.StreamConfig) []string {
	var p []string
	if c.Storage != jetstream.FileStorage {
		p = append(p, "storage is not file: a restart loses the advisories of messages to rescue")
	}
	if c.Retention != jetstream.LimitsPolicy {
		p = append(p, "retention is not limits")
	}
	return p
}
