// Package effects is the demo's side effect, applied inside the inbox
// transaction; internal, since it is the demo's and no part of the
// embedding API.
//
// The first is the [Ledger]: an intent {"account":N,"amount":M} adds M to
// account N's balance and appends a ledger entry carrying the message ID and
// the inbox scope that applied it (see [NewScopedLedger]).
// ledger_entries has no unique constraint on the message ID on purpose: if
// the inbox ever let a duplicate through, a checker would see two entries.
//
// Input is decoded strictly by [ParseIntent]: malformed JSON, unknown or
// case-variant keys, duplicate keys, wrong types, fractions, zero, negative
// or huge amounts and trailing data are permanent errors with a reason, so
// the message is dead-lettered instead of retried. The ledger marks them,
// and intents for unknown accounts, with [inbox.BadInput]: the inbox rejects
// them with [inbox.CauseBadInput].
package effects
