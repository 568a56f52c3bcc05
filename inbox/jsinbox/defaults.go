package jsinbox

import "time"

// Consumer defaults, which the horizon over which a message can come back
// assumes for the settings the servers do not hold.
const (
	// DefaultNakCap is the consumer's default longest nak delay.
	DefaultNakCap = 30 * time.Second
	// DefaultAckWait and DefaultMaxDeliver are what the consumer creates a
	// missing durable with.
	DefaultAckWait    = 30 * time.Second
	DefaultMaxDeliver = 20
)
