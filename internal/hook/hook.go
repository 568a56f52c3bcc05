// Package hook is how the project's own harnesses (its tests, the demo and
// chaos) stop the inbox, the consumer and the publisher at named points: a
// crash between COMMIT and ACK, a lost ack, a lost PubAck. The types that
// have points hold one unexported hook, nil unless a harness attached one,
// so a point costs a nil check in production. Set the points up with
// internal/failpoint; nothing here is for embedders.
package hook

import "fmt"

// Point names a place where a harness can stop the code.
type Point uint8

// The points.
const (
	// BeforeClaim fires after BEGIN, before the claim (a crash after
	// fetch).
	BeforeClaim Point = iota + 1
	// BeforeCommit fires after claims and effects, before COMMIT.
	BeforeCommit
	// AfterCommit fires after COMMIT, before the transport acks.
	AfterCommit
	// EffectPanic makes the effect handler panic.
	EffectPanic
	// SkipAck makes the consumer drop the acks of a committed batch, as a
	// lost ack on the wire would.
	SkipAck
	// LosePubAck makes the publisher treat a stored publish as timed out,
	// so that it publishes again with the same ID.
	LosePubAck
	// RelayBeforePublish fires after the outbox relay locked a batch of
	// pending rows, before it publishes them: a crash between the
	// effect's COMMIT and the relay's publish.
	RelayBeforePublish
	// RelayPubAckWait fires after the relay handed a batch to the
	// publisher, before the PubAcks are in: a crash while waiting for
	// them, some publishes stored and some not.
	RelayPubAckWait
	// RelayBeforeMark fires after every publish of a batch was
	// acknowledged, before the rows are marked sent: a crash between
	// publish and mark.
	RelayBeforeMark
)

var names = [...]string{"", "before-claim", "before-commit", "after-commit", "effect-panic", "skip-ack", "lose-puback", "relay-before-publish", "relay-puback-wait", "relay-before-mark"}

// String returns the point's name.
func (p Point) String() string {
	if int(p) < len(names) && p > 0 {
		return names[p]
	}
	return fmt.Sprintf("Point(%d)", uint8(p))
}

// Func reports whether p fires now.
type Func func(p Point) bool

// Crash is the error a crash point returns: the process died there, so
// nothing after it (a commit, an ack, a nak) happens.
type Crash struct{ Point Point }

// Error names the point.
func (c *Crash) Error() string { return "simulated crash at " + c.Point.String() }

var attachers []func(target any, f Func) bool

// Register is called by a package whose types have points, at init, with
// a function that installs f on target if target is one of its types.
func Register(attach func(target any, f Func) bool) { attachers = append(attachers, attach) }

// Attach installs f on target: an *inbox.Processor[pgx.Tx], a *jsinbox.Consumer, a
// *jsinbox.Publisher or an *outbox.Relay. It panics for any other type.
func Attach(target any, f Func) {
	for _, a := range attachers {
		if a(target, f) {
			return
		}
	}
	panic(fmt.Sprintf("hook: %T has no hook", target))
}
