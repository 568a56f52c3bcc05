package jsinbox

import "github.com/jetinbox/jetinbox/internal/jscheck"

// Consumer defaults the horizon over which a message can come back
// assumes for the settings the servers do not hold.
const (
	// DefaultNakCap is the consumer's default longest nak delay.
	DefaultNakCap = jscheck.DefaultNakCap
	// DefaultAckWait and DefaultMaxDeliver are what the consumer creates a
	// missing durable with.
	DefaultAckWait    = jscheck.DefaultAckWait
	DefaultMaxDeliver = jscheck.DefaultMaxDeliver
)
