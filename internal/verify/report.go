// The report: what verify found, and the table people read.

package verify

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"
)

// Report is what verify found. Duplicate deliveries are expected and not
// counted here; duplicate effects are violations.
type Report struct {
	StreamMessages int `json:"stream_messages"`
	DistinctIDs    int `json:"distinct_ids"`
	AppliedOnce    int `json:"applied_once"`
	// Duplicated: IDs with more than one ledger entry.
	Duplicated int `json:"duplicated"`
	// Lost: stream messages neither applied (or duplicate of applied) nor
	// dead-lettered.
	Lost int `json:"lost"`
	// Unexpected: effects or inbox rows with no message in the stream.
	Unexpected int `json:"unexpected"`
	// EffectWithoutRow and RowWithoutEffect break effect ⇔ inbox row.
	EffectWithoutRow int `json:"effect_without_row"`
	RowWithoutEffect int `json:"row_without_effect"`
	// Rejected inbox rows, conflicts recorded, dead letters by status.
	// A dead letter counts only when its headers name this stream and
	// scope and a stream sequence whose message carries the dead letter's
	// message ID (Jetinbox-Message-Id).
	Rejected     int            `json:"rejected"`
	Conflicts    int            `json:"conflicts"`
	DeadLettered int            `json:"dead_lettered"`
	DeadByStatus map[string]int `json:"dead_by_status"`
	// DeadMismatched: dead letters of this stream and scope whose message
	// ID is not the ID of the stream message at their sequence. They
	// settle nothing.
	DeadMismatched int `json:"dead_mismatched,omitempty"`
	// DeadForeign: messages in the dead-letter stream that no consumer of
	// this stream wrote (no consumer headers, another stream, not pinned
	// to the dead-letter stream, a copy of a stored message, or an expired
	// record for a message the stream still holds). They settle nothing.
	// Not a violation: they break no invariant by themselves (an intent
	// they claim to settle is judged without them), and whoever can put
	// them there could otherwise fail every verify at will; the report
	// warns instead.
	DeadForeign int `json:"dead_foreign,omitempty"`
	// ExpiredBeforeRescue: messages the server gave up on after max
	// deliveries that aged out of the stream before a consumer rescued
	// them, as the expired records the rescue leaves in the dead-letter
	// stream say. Their fate is unknown: a violation.
	ExpiredBeforeRescue int `json:"expired_before_rescue"`
	// ExpiredApplied: expired records whose stream sequence made an
	// applied inbox row (applied, then its ack was lost, then given up on
	// and aged out): settled, not a violation. Their rows and effects
	// count as judged, and their ledger entries stand for the payload
	// the stream no longer holds.
	ExpiredApplied int `json:"expired_applied,omitempty"`
	// AwaitingRescue: stream messages neither applied nor dead-lettered
	// that the server gave up on and whose max-deliveries advisory the
	// rescue durable has not settled yet (above its ack floor). Not a
	// violation, nor lost: the rescue will apply or dead-letter them.
	// AwaitingRescueSince is when the server gave up on the oldest.
	AwaitingRescue      int       `json:"awaiting_rescue"`
	AwaitingRescueSince time.Time `json:"awaiting_rescue_since,omitzero"`
	// BalanceMismatches: accounts whose balance differs from the sum of
	// the applied intents.
	BalanceMismatches int `json:"balance_mismatches"`
	// Pending: messages the durable has not settled yet (not a violation).
	Pending uint64 `json:"pending"`
	// RejectedByReason counts rejected inbox rows by reason.
	RejectedByReason map[string]int `json:"rejected_by_reason,omitempty"`
	// Horizons names settings that would let a duplicate through or lose
	// track of a message: warnings, not violations of the invariants.
	Horizons []string `json:"horizons,omitempty"`
	// Warnings name the likely cause of what follows (a scope with no
	// inbox rows at all, dead letters that match nothing). Printed first.
	Warnings []string `json:"warnings,omitempty"`
	// Partial is true when only a range of the stream was checked.
	Partial bool `json:"partial,omitempty"`
	// Examples of violations, for people.
	Examples []string `json:"examples,omitempty"`
}

// Clean reports whether no invariant is broken.
func (r *Report) Clean() bool {
	return r.Duplicated == 0 && r.Lost == 0 && r.Unexpected == 0 && r.EffectWithoutRow == 0 &&
		r.RowWithoutEffect == 0 && r.BalanceMismatches == 0 && r.ExpiredBeforeRescue == 0
}

// Violation kinds, as Violations, the JSON report and the
// jetinbox_verify_violations{kind} metric name them.
const (
	KindDuplicated       = "duplicated"
	KindLost             = "lost"
	KindUnexpected       = "unexpected"
	KindEffectWithoutRow = "effect_without_row"
	KindRowWithoutEffect = "row_without_effect"
	KindBalanceMismatch  = "balance_mismatch"
	// KindExpiredBeforeRescue: given up on, then aged out of the stream
	// before a consumer rescued it.
	KindExpiredBeforeRescue = "expired_before_rescue"
)

// ViolationKinds lists every violation kind, in the report's order.
var ViolationKinds = []string{KindDuplicated, KindLost, KindUnexpected, KindEffectWithoutRow, KindRowWithoutEffect, KindBalanceMismatch, KindExpiredBeforeRescue}

// Violations returns the count of each violation kind, every kind present
// (zero included).
func (r *Report) Violations() map[string]int {
	return map[string]int{
		KindDuplicated:          r.Duplicated,
		KindLost:                r.Lost,
		KindUnexpected:          r.Unexpected,
		KindEffectWithoutRow:    r.EffectWithoutRow,
		KindRowWithoutEffect:    r.RowWithoutEffect,
		KindBalanceMismatch:     r.BalanceMismatches,
		KindExpiredBeforeRescue: r.ExpiredBeforeRescue,
	}
}

// ViolationCount is the number of broken invariants, all kinds together.
func (r *Report) ViolationCount() int {
	n := 0
	for _, v := range r.Violations() {
		n += v
	}
	return n
}

// MarshalJSON writes the report with an explicit "clean" and the violation
// counts by kind ("violations") and in all ("violations_total") before the
// report's own fields, so that a script need not know which fields are
// violations.
func (r *Report) MarshalJSON() ([]byte, error) {
	type fields Report // the same fields, without this method
	return json.Marshal(struct {
		Clean           bool           `json:"clean"`
		Violations      map[string]int `json:"violations"`
		ViolationsTotal int            `json:"violations_total"`
		*fields
	}{r.Clean(), r.Violations(), r.ViolationCount(), (*fields)(r)})
}

// Count is a text and how many times it was found.
type Count struct {
	Text string `json:"text"`
	N    int    `json:"n"`
}

// sortedCounts returns m's entries, most first, then by text.
func sortedCounts(m map[string]int) []Count {
	out := make([]Count, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, Count{k, m[k]})
	}
	slices.SortStableFunc(out, func(a, b Count) int { return cmp.Compare(b.N, a.N) })
	return out
}

// RejectedReasons returns the rejected inbox rows grouped by reason (cut to
// 80 characters), most first, then by reason.
func (r *Report) RejectedReasons() []Count { return sortedCounts(r.RejectedByReason) }

func (r *Report) example(format string, args ...any) {
	if len(r.Examples) < 10 {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}

// WriteTable prints the report for people.
func (r *Report) WriteTable(w io.Writer) {
	for _, warn := range r.Warnings {
		fmt.Fprintln(w, "WARNING:", warn)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, v any, note string) { fmt.Fprintf(tw, "%s\t%v\t  %s\n", name, v, note) }
	row("stream messages", r.StreamMessages, "")
	row("distinct IDs", r.DistinctIDs, "")
	row("applied once", r.AppliedOnce, "")
	row("duplicated", r.Duplicated, Mark(r.Duplicated == 0))
	row("lost", r.Lost, Mark(r.Lost == 0))
	row("unexpected", r.Unexpected, Mark(r.Unexpected == 0))
	row("effect without row", r.EffectWithoutRow, Mark(r.EffectWithoutRow == 0))
	row("row without effect", r.RowWithoutEffect, Mark(r.RowWithoutEffect == 0))
	row("balance mismatches", r.BalanceMismatches, Mark(r.BalanceMismatches == 0))
	row("expired before rescue", r.ExpiredBeforeRescue, Mark(r.ExpiredBeforeRescue == 0))
	if r.ExpiredApplied > 0 {
		row("expired, found applied", r.ExpiredApplied, "(settled)")
	}
	if r.AwaitingRescue > 0 {
		row("awaiting rescue", r.AwaitingRescue, "(given up on, rescue pending: not lost)")
	}
	row("rejected (inbox)", r.Rejected, "")
	row("conflicts", r.Conflicts, "")
	row("dead-lettered", r.DeadLettered, "")
	if r.DeadMismatched > 0 {
		row("dead letters matching nothing", r.DeadMismatched, "")
	}
	if r.DeadForeign > 0 {
		row("foreign in the dead-letter stream", r.DeadForeign, "(settle nothing)")
	}
	row("still pending", r.Pending, "")
	tw.Flush()
	if r.Partial {
		fmt.Fprintln(w, "   (a range of the stream: rows and effects of other IDs, and balances, were not judged)")
	}
	for _, c := range sortedCounts(r.DeadByStatus) {
		fmt.Fprintf(w, "   dead letters %-10s %d\n", c.Text+":", c.N)
	}
	for _, c := range r.RejectedReasons() {
		fmt.Fprintf(w, "   rejected %5d  %s\n", c.N, c.Text)
	}
	for _, h := range r.Horizons {
		fmt.Fprintln(w, "   horizon:", h)
	}
	for _, e := range r.Examples {
		fmt.Fprintln(w, "  ", e)
	}
}

// Mark is "ok" or "VIOLATION", for report tables.
func Mark(ok bool) string {
	if ok {
		return "ok"
	}
	return "VIOLATION"
}
