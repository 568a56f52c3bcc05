// Package effects is where a worker's side effects meet the inbox: an
// effect is an inbox handler that writes in the transaction of the inbox
// rows of its batch, so it commits, or not, with them.
//
// This package has no code of its own on purpose. The demo's effect, a
// ledger that credits accounts with one statement per batch, lives in the
// module's internal/effects: it is the demo's, not an API to build on.
// To write an effect of your own, start from
// [github.com/jetinbox/jetinbox/inbox.HandlerFunc] (one message at a time)
// or implement [github.com/jetinbox/jetinbox/inbox.Handler] (set-based),
// and test it with package [github.com/jetinbox/jetinbox/inboxtest]. The
// runnable examples of package [github.com/jetinbox/jetinbox/inbox/jsinbox]
// show one on a real consumer.
package effects
