// Package deliveryhook is how the project's own harnesses (chaos, tests)
// put faults into a delivery dispatcher: a dispatcher that dies between
// the call and recording its outcome, and the unsafe variant that makes a
// new key for every attempt. A dispatcher holds one unexported *Faults,
// nil in production, so a fault costs a nil check. Nothing here is for
// embedders.
package deliveryhook

import "fmt"

// Faults are the faults a harness can put into a dispatcher.
type Faults struct {
	// SkipRecord, if set, is asked after a call returned and before its
	// outcome is recorded; true drops the outcome as a dispatcher that was
	// killed there would: the row keeps its lease until it expires.
	SkipRecord func() bool
	// NewKeyPerAttempt makes the dispatcher derive its key from the
	// attempt number too: the unsafe design whose retries a receiver
	// cannot recognise. Only the chaos run's unsafe row sets it.
	NewKeyPerAttempt bool
}

var attach func(target any, f *Faults) bool

// Register is called by package delivery at init.
func Register(fn func(target any, f *Faults) bool) { attach = fn }

// Attach installs f on target, a *delivery.Dispatcher; it panics for any
// other type.
func Attach(target any, f *Faults) {
	if attach == nil || !attach(target, f) {
		panic(fmt.Sprintf("deliveryhook: %T has no faults", target))
	}
}
