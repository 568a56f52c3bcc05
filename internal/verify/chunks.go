// Judging the stream a chunk at a time: the inbox row of each ID is the
// arbiter of which chunk judges it.

package verify

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/internal/effects"
)

// row is an inbox row as verify reads it.
type row struct {
	status  driver.RowStatus
	fp      []byte
	subject string
	reason  string
	seq     uint64 // the stream message that made the row
}

// checker is the state of one Run across chunks.
type checker struct {
	ctx     context.Context
	js      jetstream.JetStream
	db      DB
	o       Options
	r       *Report
	partial bool
	dl      *deadLetters
	noRows  bool

	// from is the first sequence walked, last the last of the range.
	from, last uint64
	// judgedRows: inbox rows of IDs in the range (each judged once);
	// matchedRows: those with a message of their payload in the range;
	// entryIDs: IDs in the range with ledger entries.
	judgedRows, matchedRows, entryIDs int
	// carried: IDs judged in the chunk of their first copy because their
	// row names no message of the range with their ID (no row, a row made
	// before the range or by a message gone): their later copies must not
	// be judged again. Few, unless rows are missing.
	carried map[string]bool
	// deferred: payloads of copies seen before the chunk of the message
	// that made their row, which judges them.
	deferred map[string]map[[32]byte][]byte
	// unmatched: judged rows whose payload no copy read so far has; a
	// later copy may still have it, else they are unexpected.
	unmatched map[string]row
	// want: the sum of the applied intents per account.
	want map[int64]int64
	// idAt: message IDs of sequences outside the current chunk, looked up.
	idAt map[uint64]string
	// awaiting: the messages given up on whose rescue is pending.
	awaiting awaiting
}

// ownership of an ID in a chunk.
type ownership int

const (
	ownNow     ownership = iota // the row's message is in this chunk
	ownLater                    // ... in a later chunk
	ownEarlier                  // ... in an earlier chunk, which judged it
	ownCarried                  // the row names no message of the range with this ID
)

func (c *checker) owner(id string, rw row, hasRow bool, chunkID map[uint64]string, cs, ce uint64) ownership {
	if c.carried[id] || !hasRow {
		return ownCarried
	}
	switch s := rw.seq; {
	case s >= cs && s <= ce:
		if chunkID[s] == id {
			return ownNow
		}
	case s > ce && s <= c.last:
		if c.idAtSeq(s) == id {
			return ownLater
		}
	case s >= c.from && s < cs:
		if c.idAtSeq(s) == id {
			return ownEarlier
		}
	}
	return ownCarried
}

// idAtSeq returns the message ID of the stream message at seq ("" if
// none): for copies in other chunks than their row's message, rare.
func (c *checker) idAtSeq(seq uint64) string {
	if id, ok := c.idAt[seq]; ok {
		return id
	}
	id := ""
	if s, err := c.js.Stream(c.ctx, c.o.Stream); err == nil {
		if raw, err := s.GetMsg(c.ctx, seq); err == nil {
			id = raw.Header.Get(jetstream.MsgIDHeader)
		}
	}
	c.idAt[seq] = id
	return id
}

// chunk judges one chunk of stream messages.
func (c *checker) chunk(msgs []Message) error {
	r := c.r
	if r.StreamMessages == 0 {
		c.from = msgs[0].Seq
	}
	r.StreamMessages += len(msgs)
	c.dl.visit(r, msgs)
	cs, ce := msgs[0].Seq, msgs[len(msgs)-1].Seq

	// Every payload seen per ID by fingerprint: when an ID was reused with
	// another payload, whichever copy the consumers reached first is the
	// applied one.
	byFP := map[string]map[[32]byte][]byte{}
	chunkID := make(map[uint64]string, len(msgs))
	var ids []string
	for _, m := range msgs {
		chunkID[m.Seq] = m.ID
		if m.ID == "" {
			continue
		}
		fps := byFP[m.ID]
		if fps == nil {
			fps = map[[32]byte][]byte{}
			byFP[m.ID] = fps
			ids = append(ids, m.ID)
		}
		fps[inbox.Fingerprint(m.Payload)] = m.Payload
	}
	rows, entries, err := c.read(ids)
	if err != nil {
		return err
	}
	for _, id := range ids {
		rw, hasRow := rows[id]
		fps := byFP[id]
		switch c.owner(id, rw, hasRow, chunkID, cs, ce) {
		case ownNow:
			maps.Copy(fps, c.deferred[id])
			delete(c.deferred, id)
			c.judge(id, rw, hasRow, entries[id], fps)
		case ownLater:
			d := c.deferred[id]
			if d == nil {
				d = map[[32]byte][]byte{}
				c.deferred[id] = d
			}
			maps.Copy(d, fps)
		case ownEarlier:
			c.match(id, fps)
		case ownCarried:
			if c.carried[id] {
				c.match(id, fps)
				continue
			}
			c.carried[id] = true
			c.judge(id, rw, hasRow, entries[id], fps)
		}
	}

	for _, m := range msgs {
		if c.dl.at(m.Seq, m.ID) {
			continue // dead-lettered itself
		}
		rw, ok := rows[m.ID]
		if ok && rw.status == driver.RowApplied && rw.subject == m.Subject {
			if fp := inbox.Fingerprint(m.Payload); string(rw.fp) == string(fp[:]) {
				continue // applied, or a duplicate of the applied one
			}
		}
		// Another copy of a rejected ID (a re-publish, or its
		// redelivery): the consumer terminates it without a second dead
		// letter. The row's stream sequence names the message that was
		// dead-lettered.
		if ok && rw.status == driver.RowRejected && c.dl.at(rw.seq, m.ID) {
			continue
		}
		if since, ok := c.awaiting.seqs[m.Seq]; ok {
			r.AwaitingRescue++
			if r.AwaitingRescueSince.IsZero() || since.Before(r.AwaitingRescueSince) {
				r.AwaitingRescueSince = since
			}
			continue
		}
		r.Lost++
		if !c.noRows {
			r.example("lost: stream seq %d (id %q) neither applied nor dead-lettered", m.Seq, m.ID)
		}
	}
	return nil
}

// read returns the inbox rows and the ledger entry counts of ids.
func (c *checker) read(ids []string) (map[string]row, map[string]int, error) {
	rows := make(map[string]row, len(ids))
	entries := map[string]int{}
	// An ID the inbox would refuse (a NUL, invalid UTF-8, too long) has no
	// row and no entry, and PostgreSQL cannot even take it as a parameter.
	valid := ids[:0:0]
	for _, id := range ids {
		if inbox.ValidateID(id) == nil {
			valid = append(valid, id)
		}
	}
	ids = valid
	if len(ids) == 0 {
		return rows, entries, nil
	}
	dbRows, err := c.db.query(c.ctx, stmt{
		`SELECT message_id, status, fingerprint, coalesce(reason, ''), stream_seq, subject FROM inbox WHERE scope = $1 AND message_id = ANY($2)`,
		`SELECT message_id, status, fingerprint, coalesce(reason, ''), stream_seq, subject FROM inbox WHERE scope = ?1 AND message_id IN (SELECT value FROM json_each(?2))`,
	}, c.o.Scope, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("verify: inbox: %w", err)
	}
	for dbRows.Next() {
		var id, status string
		var rw row
		var seq int64
		if err := dbRows.Scan(&id, &status, &rw.fp, &rw.reason, &seq, &rw.subject); err != nil {
			return nil, nil, fmt.Errorf("verify: inbox: %w", err)
		}
		rw.status, rw.seq = driver.RowStatus(status), uint64(max(seq, 0))
		rows[id] = rw
	}
	if err := dbRows.Err(); err != nil {
		return nil, nil, fmt.Errorf("verify: inbox: %w", err)
	}
	if !c.o.Ledger {
		return rows, entries, nil
	}
	lr, err := c.db.query(c.ctx, stmt{
		`SELECT message_id, count(*) FROM ledger_entries WHERE scope = $1 AND message_id = ANY($2) GROUP BY message_id`,
		`SELECT message_id, count(*) FROM ledger_entries WHERE scope = ?1 AND message_id IN (SELECT value FROM json_each(?2)) GROUP BY message_id`,
	}, c.o.Scope, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("verify: ledger: %w", err)
	}
	for lr.Next() {
		var id string
		var n int
		if err := lr.Scan(&id, &n); err != nil {
			return nil, nil, fmt.Errorf("verify: ledger: %w", err)
		}
		entries[id] = n
	}
	if err := lr.Err(); err != nil {
		return nil, nil, fmt.Errorf("verify: ledger: %w", err)
	}
	return rows, entries, nil
}

func cutReason(reason string) string {
	if len(reason) > 80 {
		return reason[:80] + "…"
	}
	return reason
}

// judge judges one ID of the range, once: its inbox row, its effect and
// the copies of it read so far (fps).
func (c *checker) judge(id string, rw row, hasRow bool, n int, fps map[[32]byte][]byte) {
	r := c.r
	r.DistinctIDs++
	applied := hasRow && rw.status == driver.RowApplied
	if hasRow {
		c.judgedRows++
		if rw.status == driver.RowRejected {
			r.Rejected++
			r.RejectedByReason[cutReason(rw.reason)]++
		}
		if len(rw.fp) != 32 {
			r.Unexpected++
			r.example("unexpected: inbox row %q has a %d-byte fingerprint", id, len(rw.fp))
		} else if payload, ok := fps[[32]byte(rw.fp)]; ok {
			c.matched(rw, payload)
		} else {
			c.unmatched[id] = rw
		}
	}
	if c.o.Ledger {
		if n > 0 {
			c.entryIDs++
			if n > 1 {
				r.Duplicated++
				r.example("duplicated: %q has %d ledger entries", id, n)
			}
			if !applied {
				r.EffectWithoutRow++
				r.example("effect without applied inbox row: %q", id)
			}
		}
		if applied && n == 0 {
			r.RowWithoutEffect++
			r.example("applied inbox row without effect: %q", id)
		}
	}
	if applied && (!c.o.Ledger || n == 1) {
		r.AppliedOnce++
	}
}

// match looks for the payload of a judged row still unmatched among more
// copies of its ID.
func (c *checker) match(id string, fps map[[32]byte][]byte) {
	rw, ok := c.unmatched[id]
	if !ok {
		return
	}
	if payload, ok := fps[[32]byte(rw.fp)]; ok {
		delete(c.unmatched, id)
		c.matched(rw, payload)
	}
}

// matched counts a row whose payload is in the range, and its intent
// towards the balances.
func (c *checker) matched(rw row, payload []byte) {
	c.matchedRows++
	if !c.o.Ledger || c.partial || rw.status != driver.RowApplied {
		return
	}
	if in, err := effects.ParseIntent(payload); err == nil {
		c.want[in.Account] += in.Amount
	}
}

// finish judges what the chunks left open: copies whose row's message was
// never reached, rows without a payload in the range, and, for the whole
// stream, the rows and effects of IDs that are in no stream message.
func (c *checker) finish() error {
	r := c.r
	c.dl.done()
	if len(c.deferred) > 0 {
		ids := slices.Sorted(maps.Keys(c.deferred))
		rows, entries, err := c.read(ids)
		if err != nil {
			return err
		}
		for _, id := range ids {
			rw, hasRow := rows[id]
			c.judge(id, rw, hasRow, entries[id], c.deferred[id])
		}
		c.deferred = nil
	}
	for _, id := range slices.Sorted(maps.Keys(c.unmatched)) {
		r.Unexpected++
		r.example("unexpected: inbox row %q has no message with its payload in the stream", id)
	}
	if c.partial {
		return nil // rows and effects of other IDs are not judged
	}
	return c.outside()
}

// outside counts, over the whole scope, what the chunks cannot see: inbox
// rows and ledger entries of IDs that are in no stream message. The
// scope-wide counts are taken from PostgreSQL in aggregate (nothing per ID
// comes back) and the range's share is subtracted.
func (c *checker) outside() error {
	r, ctx, scope := c.r, c.ctx, c.o.Scope
	var rows, applied, appliedOnce, appliedNone int
	q := `SELECT count(*), count(*) FILTER (WHERE status = 'applied'), 0, 0 FROM inbox WHERE scope = $1`
	if c.o.Ledger {
		q = `SELECT count(*),
	count(*) FILTER (WHERE i.status = 'applied'),
	count(*) FILTER (WHERE i.status = 'applied' AND l.n = 1),
	count(*) FILTER (WHERE i.status = 'applied' AND l.n IS NULL)
FROM inbox i LEFT JOIN (SELECT message_id, count(*) AS n FROM ledger_entries WHERE scope = $1 GROUP BY message_id) l USING (message_id)
WHERE i.scope = $1`
	}
	// The same statements read the same on SQLite, with ?1 for $1.
	if err := c.db.queryRow(ctx, stmt{q, strings.ReplaceAll(q, "$1", "?1")}, scope).Scan(&rows, &applied, &appliedOnce, &appliedNone); err != nil {
		return fmt.Errorf("verify: inbox: %w", err)
	}
	if n := rows - c.judgedRows; n > 0 {
		r.Unexpected += n
		r.example("unexpected: %d inbox rows of IDs that are in no stream message", n)
	}
	if c.o.Ledger {
		r.AppliedOnce = appliedOnce
		if appliedNone > r.RowWithoutEffect {
			r.example("applied inbox row without effect: %d of IDs that are in no stream message", appliedNone-r.RowWithoutEffect)
			r.RowWithoutEffect = appliedNone
		}
	} else {
		r.AppliedOnce = applied
	}
	reasons, err := c.db.query(ctx, stmt{
		`SELECT coalesce(reason, ''), count(*) FROM inbox WHERE scope = $1 AND status = 'rejected' GROUP BY 1`,
		`SELECT coalesce(reason, ''), count(*) FROM inbox WHERE scope = ?1 AND status = 'rejected' GROUP BY 1`,
	}, scope)
	if err != nil {
		return fmt.Errorf("verify: inbox: %w", err)
	}
	r.Rejected, r.RejectedByReason = 0, map[string]int{}
	for reasons.Next() {
		var reason string
		var n int
		if err := reasons.Scan(&reason, &n); err != nil {
			return fmt.Errorf("verify: inbox: %w", err)
		}
		r.Rejected += n
		r.RejectedByReason[cutReason(reason)] += n
	}
	if err := reasons.Err(); err != nil {
		return fmt.Errorf("verify: inbox: %w", err)
	}
	if !c.o.Ledger {
		return nil
	}
	var ids, dup, withoutRow int
	ledgerQ := `SELECT count(*),
	count(*) FILTER (WHERE l.n > 1),
	count(*) FILTER (WHERE i.status IS DISTINCT FROM 'applied')
FROM (SELECT message_id, count(*) AS n FROM ledger_entries WHERE scope = $1 GROUP BY message_id) l
LEFT JOIN inbox i ON i.scope = $1 AND i.message_id = l.message_id`
	if err := c.db.queryRow(ctx, stmt{ledgerQ, strings.ReplaceAll(ledgerQ, "$1", "?1")}, scope).Scan(&ids, &dup, &withoutRow); err != nil {
		return fmt.Errorf("verify: ledger: %w", err)
	}
	if n := ids - c.entryIDs; n > 0 {
		r.Unexpected += n
		r.example("unexpected: ledger entries for %d IDs that are in no stream message", n)
	}
	if dup > r.Duplicated {
		r.example("duplicated: %d IDs that are in no stream message have more than one ledger entry", dup-r.Duplicated)
		r.Duplicated = dup
	}
	if withoutRow > r.EffectWithoutRow {
		r.example("effect without applied inbox row: %d of IDs that are in no stream message", withoutRow-r.EffectWithoutRow)
		r.EffectWithoutRow = withoutRow
	}
	return nil
}

// balances compares every account's balance with the applied intents of
// this scope plus the entries of the other scopes.
func (c *checker) balances() error {
	r, ctx, want := c.r, c.ctx, c.want
	// Other scopes apply their own effects to the same accounts: take
	// their entries as they are (their own verify judges them), so that
	// this scope's intents are still checked to the unit.
	or, err := c.db.query(ctx, stmt{
		`SELECT account, sum(amount)::bigint FROM ledger_entries WHERE scope <> $1 GROUP BY account`,
		`SELECT account, sum(amount) FROM ledger_entries WHERE scope <> ?1 GROUP BY account`,
	}, c.o.Scope)
	if err != nil {
		return fmt.Errorf("verify: ledger of other scopes: %w", err)
	}
	for or.Next() {
		var acct, sum int64
		if err := or.Scan(&acct, &sum); err != nil {
			return fmt.Errorf("verify: ledger of other scopes: %w", err)
		}
		want[acct] += sum
	}
	if err := or.Err(); err != nil {
		return fmt.Errorf("verify: ledger of other scopes: %w", err)
	}
	br, err := c.db.query(ctx, stmt{`SELECT id, balance FROM accounts`, `SELECT id, balance FROM accounts`})
	if err != nil {
		return fmt.Errorf("verify: accounts: %w", err)
	}
	for br.Next() {
		var id, bal int64
		if err := br.Scan(&id, &bal); err != nil {
			return fmt.Errorf("verify: accounts: %w", err)
		}
		if bal != want[id] {
			r.BalanceMismatches++
			r.example("account %d: balance %d, applied intents sum to %d", id, bal, want[id])
		}
	}
	if err := br.Err(); err != nil {
		return fmt.Errorf("verify: accounts: %w", err)
	}
	return nil
}

// expiredApplied settles the expired records whose message was applied
// before it aged out: the consumer committed it on its last delivery and
// the ack was lost (a crash, a cut connection), so the server gave up on
// it, and it aged out before the rescue could read it back and find it
// applied. The inbox row the message made names its stream sequence. Such
// a record is no violation; its row and effect are judged here, as no
// chunk holds their message any more, and its ledger entry stands for the
// payload in the balances. Every other expired record stays a violation
// with an example.
func (c *checker) expiredApplied() error {
	r, dl := c.r, c.dl
	if len(dl.expired) == 0 {
		return nil
	}
	seqs := slices.Sorted(maps.Keys(dl.expired))
	args := make([]int64, len(seqs))
	for i, s := range seqs {
		args[i] = int64(s)
	}
	q, err := c.db.query(c.ctx, stmt{
		`SELECT message_id, stream_seq FROM inbox WHERE scope = $1 AND status = 'applied' AND stream_seq = ANY($2)`,
		`SELECT message_id, stream_seq FROM inbox WHERE scope = ?1 AND status = 'applied' AND stream_seq IN (SELECT value FROM json_each(?2))`,
	}, c.o.Scope, args)
	if err != nil {
		return fmt.Errorf("verify: inbox rows of expired messages: %w", err)
	}
	applied := map[uint64]string{}
	for q.Next() {
		var id string
		var seq int64
		if err := q.Scan(&id, &seq); err != nil {
			q.Close()
			return fmt.Errorf("verify: inbox rows of expired messages: %w", err)
		}
		applied[uint64(seq)] = id
	}
	q.Close()
	if err := q.Err(); err != nil {
		return fmt.Errorf("verify: inbox rows of expired messages: %w", err)
	}
	var ids []string
	for _, seq := range seqs {
		id, ok := applied[seq]
		if !ok {
			r.example("expired before rescue: stream seq %d was given up on after %s deliveries and aged out of %s before a consumer rescued it; no inbox row names it, so whether it was applied is unknown",
				seq, dl.expired[seq], c.o.Stream)
			continue
		}
		r.ExpiredBeforeRescue--
		r.ExpiredApplied++
		if !c.carried[id] {
			c.carried[id] = true // a later copy in the stream is not judged again
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	_, entries, err := c.read(ids)
	if err != nil {
		return err
	}
	for _, id := range ids {
		c.judgedRows++
		c.r.DistinctIDs++
		if !c.o.Ledger {
			c.r.AppliedOnce++
			continue
		}
		switch n := entries[id]; {
		case n == 0:
			r.RowWithoutEffect++
			r.example("applied inbox row without effect: %q (its message expired before rescue)", id)
		case n > 1:
			c.entryIDs++
			r.Duplicated++
			r.example("duplicated: %q has %d ledger entries", id, n)
		default:
			c.entryIDs++
			r.AppliedOnce++
		}
	}
	if c.partial || !c.o.Ledger {
		return nil
	}
	// The payload is gone: the effect recorded is what the balances
	// expect of it (one entry per ID; a second is a duplicate above).
	lr, err := c.db.query(c.ctx, stmt{
		`SELECT DISTINCT ON (message_id) account, amount FROM ledger_entries WHERE scope = $1 AND message_id = ANY($2) ORDER BY message_id`,
		`SELECT account, amount FROM ledger_entries WHERE scope = ?1 AND message_id IN (SELECT value FROM json_each(?2)) GROUP BY message_id`,
	}, c.o.Scope, ids)
	if err != nil {
		return fmt.Errorf("verify: ledger of expired messages: %w", err)
	}
	defer lr.Close()
	for lr.Next() {
		var acct, amount int64
		if err := lr.Scan(&acct, &amount); err != nil {
			return fmt.Errorf("verify: ledger of expired messages: %w", err)
		}
		c.want[acct] += amount
	}
	if err := lr.Err(); err != nil {
		return fmt.Errorf("verify: ledger of expired messages: %w", err)
	}
	return nil
}
