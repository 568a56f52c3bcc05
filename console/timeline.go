package console

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/idempotency"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/dlq"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// Fact is one thing a hop source found about an intent, with where it
// came from.
type Fact struct {
	// Hop names the hop: "http key", "outbox", "stream", "delivery",
	// "inbox", "effect", "conflict", "dead letter", "follow-up".
	Hop string
	// At is when it happened, if the source knows (zero: unknown; the
	// fact is placed after the one before it).
	At time.Time
	// What says it, for people.
	What string
	// Source is where it was read: "INTENTS seq 42", "table inbox".
	Source string
	// Level is "ok", "info", "warn" or "bad", for the page's colour.
	Level string
	// Tag, if set, feeds the verdict: "applied", "rejected", "effect",
	// "conflict", "dead", "in-stream", "pending", "settled", "accepted",
	// "unsent".
	Tag string
	// Seq is the intents stream sequence the fact names, if any.
	Seq uint64

	sortAt time.Time
}

// Query is the intent asked about, as the sources resolve it: by message
// ID, or by HTTP Idempotency-Key (the key source adds the IDs the key's
// rows stand for).
type Query struct {
	// Key is the HTTP Idempotency-Key asked for ("" when asked by ID).
	Key string
	// IDs are the message IDs followed: the one asked for, or those the
	// key resolved to.
	IDs []string
	// Seqs are the intents stream sequences the sources found so far
	// (inbox rows, conflicts, dead letters), read by the stream source.
	Seqs map[uint64]bool
}

// Sources is what a hop source reads with: the console's own clients,
// under its read-only credentials.
type Sources struct {
	JS                     jetstream.JetStream
	Stream, Scope, Durable string
	// DBs are the inbox's databases: one, or one per shard (Name set).
	DBs []SourceDB
	// Shards is the sharded stream's map, nil when not sharded.
	Shards *shard.Map
	// ScanWindow is how many of the stream's last messages the stream
	// source reads to find the intent's copies.
	ScanWindow uint64

	deadLetters []dlq.Letter
	deadErr     error
	deadRead    bool
}

// SourceDB is one database a hop source may read: PostgreSQL (PG) or
// SQLite.
type SourceDB struct {
	Name   string
	PG     *pgxpool.Pool
	SQLite *sql.DB
}

func (s SourceDB) db() db { return db{name: s.Name, pg: s.PG, lite: s.SQLite} }

// DeadLetters returns the scope's dead letters, read once per timeline
// through the dlq package, with direct gets (the verifier's NATS user may
// create no consumer).
func (s *Sources) DeadLetters(ctx context.Context) ([]dlq.Letter, error) {
	if !s.deadRead {
		s.deadLetters, s.deadErr = dlq.ReadDirect(ctx, s.JS, s.Stream, s.Scope)
		s.deadRead = true
	}
	return s.deadLetters, s.deadErr
}

// HopSource reads one hop's facts about the intent. Sources run in the
// order given; one may add to q (IDs, Seqs) for those after it. An error
// is shown as a fact of its hop, not as a failed page.
type HopSource struct {
	Hop  string
	Read func(ctx context.Context, s *Sources, q *Query) ([]Fact, error)
}

// DefaultHops are the timeline's sources: the HTTP key, the intake's
// outbox row, the inbox row, conflicts, dead letters, the stream's copies,
// their deliveries, the effect, and follow-ups. A new hop (outgoing
// deliveries, say) is one more HopSource appended to this list.
func DefaultHops() []HopSource {
	return []HopSource{
		{"http key", keyHop},
		{"outbox", outboxHop},
		{"inbox", inboxHop},
		{"conflict", conflictHop},
		{"dead letter", deadHop},
		{"stream", streamHop},
		{"delivery", deliveryHop},
		{"effect", effectHop},
		{"follow-up", followUpHop},
	}
}

// Timeline is what the intent page shows.
type Timeline struct {
	Query   Query
	Asked   string
	Facts   []Fact
	Verdict string
	Level   string
}

// maxIDs bounds the IDs one key may resolve to (one per tenant that used it).
const maxIDs = 20

// timeline runs every source for an ID or a key.
func (c *Console) timeline(ctx context.Context, id, key string) *Timeline {
	q := Query{Key: key, Seqs: map[uint64]bool{}}
	asked := "intent " + id
	if id != "" {
		q.IDs = []string{id}
	} else {
		asked = "Idempotency-Key " + key
	}
	src := c.sources()
	t := &Timeline{Asked: asked}
	for _, h := range c.cfg.Hops {
		fs, err := h.Read(ctx, src, &q)
		for i := range fs {
			if fs[i].Hop == "" {
				fs[i].Hop = h.Hop
			}
		}
		t.Facts = append(t.Facts, fs...)
		if err != nil {
			t.Facts = append(t.Facts, Fact{Hop: h.Hop, What: "could not be read: " + err.Error(), Level: "warn"})
		}
	}
	// In time order; a fact without a time stays after the one before it.
	var last time.Time
	for i := range t.Facts {
		if !t.Facts[i].At.IsZero() {
			last = t.Facts[i].At
		}
		t.Facts[i].sortAt = last
	}
	sort.SliceStable(t.Facts, func(i, j int) bool { return t.Facts[i].sortAt.Before(t.Facts[j].sortAt) })
	t.Query = q
	t.Verdict, t.Level = verdict(t.Facts, c.cfg.ScanWindow)
	return t
}

func (c *Console) sources() *Sources {
	s := &Sources{JS: c.cfg.JS, Stream: c.cfg.Stream, Scope: c.cfg.Scope, Durable: c.cfg.Durable, Shards: c.cfg.Shards, ScanWindow: c.cfg.ScanWindow}
	if c.cfg.Shards != nil && len(c.cfg.ShardPools) > 0 {
		for _, sh := range c.cfg.Shards.Shards {
			if p := c.cfg.ShardPools[sh.Name]; p != nil {
				s.DBs = append(s.DBs, SourceDB{Name: sh.Name, PG: p})
			}
		}
		return s
	}
	s.DBs = []SourceDB{{PG: c.cfg.ReadPG, SQLite: c.cfg.ReadSQLite}}
	return s
}

// verdict says in one line what happened.
func verdict(fs []Fact, window uint64) (string, string) {
	has := map[string][]Fact{}
	for _, f := range fs {
		if f.Tag != "" {
			has[f.Tag] = append(has[f.Tag], f)
		}
	}
	var extra []string
	if n := len(has["conflict"]); n > 0 {
		extra = append(extra, fmt.Sprintf("conflict: the ID was published %d time(s) with another payload (stream seq %d), not applied", n, has["conflict"][0].Seq))
	}
	suffix := ""
	if len(extra) > 0 {
		suffix = "; " + strings.Join(extra, "; ")
	}
	switch {
	case len(has["applied"]) > 0:
		a := has["applied"][0]
		switch n := len(has["effect"]); {
		case n == 0:
			return fmt.Sprintf("applied at %s (stream seq %d), but no ledger entry found: run jetinbox verify%s", fmtTime(a.At), a.Seq, suffix), "bad"
		case n > 1:
			return fmt.Sprintf("DUPLICATED: %d ledger entries for one applied inbox row (stream seq %d)%s", n, a.Seq, suffix), "bad"
		}
		conflicting := map[uint64]bool{}
		for _, f := range has["conflict"] {
			conflicting[f.Seq] = true
		}
		copies := 0
		for _, f := range has["in-stream"] {
			if !conflicting[f.Seq] {
				copies++
			}
		}
		note := ""
		switch {
		case copies == 2:
			note = ", another copy in the stream was settled as a duplicate"
		case copies > 2:
			note = fmt.Sprintf(", %d more copies in the stream were settled as duplicates", copies-1)
		}
		return fmt.Sprintf("applied once at %s (stream seq %d)%s%s", fmtTime(a.At), a.Seq, note, suffix), "ok"
	case len(has["rejected"]) > 0 || len(has["dead"]) > 0:
		why := ""
		if d := has["dead"]; len(d) > 0 {
			why = d[0].What
		} else {
			why = has["rejected"][0].What
		}
		return "dead-lettered: " + why + suffix, "warn"
	case len(has["pending"]) > 0:
		return fmt.Sprintf("still pending: in the stream at seq %d, not yet settled by its durable%s", has["pending"][0].Seq, suffix), "info"
	case len(has["settled"]) > 0:
		return fmt.Sprintf("settled by its durable at stream seq %d but no inbox row or dead letter found: run jetinbox verify (pruned, or lost)%s", has["settled"][0].Seq, suffix), "bad"
	case len(has["unsent"]) > 0:
		return "accepted over HTTP and still in the outbox: not published yet (is jetinbox relay running?)" + suffix, "info"
	case len(has["accepted"]) > 0:
		return "published from the outbox, but not found in the last stream messages read nor in the inbox" + suffix, "warn"
	case len(extra) > 0:
		return strings.TrimPrefix(suffix, "; "), "warn"
	}
	return fmt.Sprintf("not found: no key, inbox row, dead letter, or copy among the stream's last %d messages", window), "info"
}

// eachDB runs fn on every database of the sources, naming the shard in
// the source of each fact.
func eachDB(ctx context.Context, s *Sources, fn func(d db, where string) ([]Fact, error)) ([]Fact, error) {
	var out []Fact
	var errs []error
	for _, sd := range s.DBs {
		where := ""
		if sd.Name != "" {
			where = " of shard " + sd.Name
		}
		fs, err := fn(sd.db(), where)
		out = append(out, fs...)
		if err != nil && !missingTable(err) {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

func keyHop(ctx context.Context, s *Sources, q *Query) ([]Fact, error) {
	return eachDB(ctx, s, func(d db, where string) ([]Fact, error) {
		var rows rowsIter
		var done func()
		var err error
		switch {
		case q.Key != "":
			rows, done, err = d.query(ctx, `SELECT principal, method, route, key, status, created_at FROM idempotency_keys WHERE key = $1 LIMIT 20`, q.Key)
		case len(q.IDs) == 1 && strings.HasPrefix(q.IDs[0], "idem:"):
			// An intake's ID is the first 24 bytes of its key's scope
			// hash: a range of the primary key.
			h, herr := hex.DecodeString(strings.TrimPrefix(q.IDs[0], "idem:"))
			if herr != nil || len(h) != 24 {
				return nil, nil
			}
			lo := append(bytes.Clone(h), make([]byte, 8)...)
			hi := append(bytes.Clone(h), bytes.Repeat([]byte{0xff}, 8)...)
			rows, done, err = d.query(ctx, `SELECT principal, method, route, key, status, created_at FROM idempotency_keys WHERE scope_hash >= $1 AND scope_hash <= $2 LIMIT 20`, lo, hi)
		default:
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		defer done()
		var out []Fact
		for rows.Next() {
			var principal, method, route, key string
			var status int
			var created any
			if err := rows.Scan(&principal, &method, &route, &key, &status, &created); err != nil {
				return out, err
			}
			id := idempotency.Scope{Principal: principal, Method: method, Route: route, Key: key}.ID()
			if q.Key != "" && len(q.IDs) < maxIDs {
				q.IDs = append(q.IDs, id)
			}
			out = append(out, Fact{At: when(created), Tag: "key", Level: "info", Source: "table idempotency_keys" + where,
				What: fmt.Sprintf("%s %s with Idempotency-Key %q by %q answered %d: intent %s", method, route, Safe([]byte(key), 300), Safe([]byte(principal), 200), status, id)})
		}
		return out, rows.Err()
	})
}

func outboxHop(ctx context.Context, s *Sources, q *Query) ([]Fact, error) {
	return eachDB(ctx, s, func(d db, where string) ([]Fact, error) {
		var out []Fact
		for _, id := range q.IDs {
			rows, done, err := d.query(ctx, `SELECT subject, created_at, sent_at, coalesce(failed, '') FROM outbox WHERE id = $1`, id)
			if err != nil {
				return out, err
			}
			for rows.Next() {
				var subject, failed string
				var created, sent any
				if err := rows.Scan(&subject, &created, &sent, &failed); err != nil {
					done()
					return out, err
				}
				f := Fact{At: when(created), Source: "table outbox" + where, Level: "info", Tag: "accepted",
					What: fmt.Sprintf("outbox row for subject %s", Safe([]byte(subject), 300))}
				switch {
				case failed != "":
					f.What += ": FAILED: " + Safe([]byte(failed), 1000)
					f.Level, f.Tag = "bad", "unsent"
				case sent == nil:
					f.What += ": pending, not published yet"
					f.Tag = "unsent"
				default:
					f.What += fmt.Sprintf(": published at %s", fmtTime(when(sent)))
				}
				out = append(out, f)
			}
			err = rows.Err()
			done()
			if err != nil {
				return out, err
			}
		}
		return out, nil
	})
}

func inboxHop(ctx context.Context, s *Sources, q *Query) ([]Fact, error) {
	return eachDB(ctx, s, func(d db, where string) ([]Fact, error) {
		var out []Fact
		for _, id := range q.IDs {
			rows, done, err := d.query(ctx, `SELECT status, coalesce(reason, ''), stream_seq, subject, received_at FROM inbox WHERE scope = $1 AND message_id = $2`, s.Scope, id)
			if err != nil {
				return out, err
			}
			for rows.Next() {
				var status, reason, subject string
				var seq int64
				var at any
				if err := rows.Scan(&status, &reason, &seq, &subject, &at); err != nil {
					done()
					return out, err
				}
				q.Seqs[uint64(seq)] = true
				f := Fact{At: when(at), Seq: uint64(seq), Source: fmt.Sprintf("table inbox%s (scope %s)", where, Safe([]byte(s.Scope), 100)), Tag: status}
				if status == "applied" {
					f.Level, f.What = "ok", fmt.Sprintf("inbox row applied: stream seq %d, subject %s", seq, Safe([]byte(subject), 300))
				} else {
					f.Level, f.What = "warn", fmt.Sprintf("inbox row %s: %s (stream seq %d)", status, Safe([]byte(reason), 1000), seq)
				}
				out = append(out, f)
			}
			err = rows.Err()
			done()
			if err != nil {
				return out, err
			}
		}
		return out, nil
	})
}

func conflictHop(ctx context.Context, s *Sources, q *Query) ([]Fact, error) {
	return eachDB(ctx, s, func(d db, where string) ([]Fact, error) {
		var out []Fact
		for _, id := range q.IDs {
			rows, done, err := d.query(ctx, `SELECT stream_seq, subject, seen_at FROM inbox_conflicts WHERE scope = $1 AND message_id = $2 ORDER BY stream_seq LIMIT 50`, s.Scope, id)
			if err != nil {
				return out, err
			}
			for rows.Next() {
				var seq int64
				var subject string
				var at any
				if err := rows.Scan(&seq, &subject, &at); err != nil {
					done()
					return out, err
				}
				q.Seqs[uint64(seq)] = true
				out = append(out, Fact{At: when(at), Seq: uint64(seq), Level: "bad", Tag: "conflict", Source: "table inbox_conflicts" + where,
					What: fmt.Sprintf("conflict: stream seq %d carries the ID with another payload (subject %s): not applied", seq, Safe([]byte(subject), 300))})
			}
			err = rows.Err()
			done()
			if err != nil {
				return out, err
			}
		}
		return out, nil
	})
}

func deadHop(ctx context.Context, s *Sources, q *Query) ([]Fact, error) {
	dead, err := s.DeadLetters(ctx)
	if err != nil {
		if strings.Contains(err.Error(), "not found") {
			return nil, nil // no dead-letter stream: nothing dead-lettered
		}
		return nil, err
	}
	want := map[string]bool{}
	for _, id := range q.IDs {
		want[id] = true
	}
	var out []Fact
	for _, d := range dead {
		if !want[d.ID] {
			continue
		}
		if d.OrigSeq != 0 {
			q.Seqs[d.OrigSeq] = true
		}
		out = append(out, Fact{At: d.DeadLetteredAt, Seq: d.OrigSeq, Level: "warn", Tag: "dead",
			Source: fmt.Sprintf("%s seq %d", jsinbox.DeadLetterStream(s.Stream), d.Seq),
			What: fmt.Sprintf("%s after %s deliveries because %s (original at stream seq %d)", Safe([]byte(d.Status), 40), Safe([]byte(d.Deliveries), 20),
				Safe([]byte(d.Reason), 1000), d.OrigSeq)})
	}
	return out, nil
}

// streamHop finds the intent's copies in the intents stream. JetStream
// does not index messages by Nats-Msg-Id, so it reads what the other
// sources name (inbox rows, conflicts, dead letters) by sequence, and the
// stream's last ScanWindow messages with verify's direct-get reader,
// matching the ID: copies older than the window and named by nothing are
// not found (the page says so).
func streamHop(ctx context.Context, s *Sources, q *Query) ([]Fact, error) {
	st, err := s.JS.Stream(ctx, s.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", s.Stream, err)
	}
	state := st.CachedInfo().State
	want := map[string]bool{}
	for _, id := range q.IDs {
		want[id] = true
	}
	found := map[uint64]verify.Message{}
	from := uint64(1)
	if state.LastSeq > s.ScanWindow {
		from = state.LastSeq - s.ScanWindow + 1
	}
	if from < state.FirstSeq {
		from = state.FirstSeq
	}
	if state.Msgs > 0 && len(want) > 0 {
		msgs, err := verify.ReadRange(ctx, s.JS, s.Stream, verify.Range{FromSeq: from, ToSeq: state.LastSeq}, nil)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if want[m.ID] {
				found[m.Seq] = m
			}
		}
	}
	var out []Fact
	shown := map[uint64]bool{}
	for seq := range q.Seqs {
		if seq == 0 {
			continue
		}
		if m, ok := found[seq]; ok {
			shown[seq] = true
			out = append(out, copyFact(s.Stream, m, time.Time{}))
			continue
		}
		raw, err := st.GetMsg(ctx, seq)
		if err != nil {
			what := fmt.Sprintf("stream seq %d could not be read: %v", seq, err)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				what = fmt.Sprintf("stream seq %d is no longer in %s (aged out or never there)", seq, s.Stream)
			}
			out = append(out, Fact{Seq: seq, Level: "info", Source: fmt.Sprintf("%s seq %d", s.Stream, seq), What: what})
			continue
		}
		m := verify.Message{Seq: seq, ID: raw.Header.Get(jetstream.MsgIDHeader), Subject: raw.Subject, Payload: raw.Data}
		if !want[m.ID] {
			out = append(out, Fact{Seq: seq, At: raw.Time, Level: "bad", Source: fmt.Sprintf("%s seq %d", s.Stream, seq),
				What: fmt.Sprintf("stream seq %d holds another intent (%s), not this one", seq, Safe([]byte(m.ID), 200))})
			continue
		}
		found[seq], shown[seq] = m, true
		out = append(out, copyFact(s.Stream, m, raw.Time))
	}
	seqs := make([]uint64, 0, len(found))
	for seq := range found {
		seqs = append(seqs, seq)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	for _, seq := range seqs {
		if shown[seq] {
			continue
		}
		q.Seqs[seq] = true
		m := found[seq]
		out = append(out, copyFact(s.Stream, m, time.Time{}))
	}
	if len(found) == 0 && len(q.IDs) > 0 {
		out = append(out, Fact{Level: "info", Source: fmt.Sprintf("%s seqs %d–%d", s.Stream, from, state.LastSeq),
			What: fmt.Sprintf("no copy among the stream's last %d messages (not indexed by ID: older copies are found only through the inbox or a dead letter)", s.ScanWindow)})
	}
	return out, nil
}

func copyFact(stream string, m verify.Message, at time.Time) Fact {
	return Fact{Seq: m.Seq, At: at, Level: "info", Tag: "in-stream", Source: fmt.Sprintf("%s seq %d", stream, m.Seq),
		What: fmt.Sprintf("stream message %d, subject %s, %d payload bytes: %s", m.Seq, Safe([]byte(m.Subject), 300), len(m.Payload), Safe(m.Payload, 300))}
}

// deliveryHop says, per copy in the stream, whether its durable has
// settled it. The inbox keeps no per-delivery record: how often a copy was
// delivered is known from its dead letter (Jetinbox-Deliveries), and the
// durable's redelivered total is on the overview.
func deliveryHop(ctx context.Context, s *Sources, q *Query) ([]Fact, error) {
	var out []Fact
	seqs := make([]uint64, 0, len(q.Seqs))
	for seq := range q.Seqs {
		if seq != 0 {
			seqs = append(seqs, seq)
		}
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	floors := map[string]uint64{}
	for _, seq := range seqs {
		durable := s.Durable
		if s.Shards != nil && len(q.IDs) > 0 {
			durable = s.Shards.Durable(shard.PartitionOf(q.IDs[0], s.Shards.Partitions))
		}
		floor, ok := floors[durable]
		if !ok {
			c, err := s.JS.Consumer(ctx, s.Stream, durable)
			if err != nil {
				return out, fmt.Errorf("durable %s: %w", durable, err)
			}
			info, err := c.Info(ctx)
			if err != nil {
				return out, fmt.Errorf("durable %s: %w", durable, err)
			}
			floor = info.AckFloor.Stream
			floors[durable] = floor
		}
		f := Fact{Seq: seq, Level: "info", Source: fmt.Sprintf("durable %s (ack floor %d)", durable, floor)}
		if seq <= floor {
			f.Tag, f.What = "settled", fmt.Sprintf("stream seq %d settled by durable %s (acked or terminated)", seq, durable)
		} else {
			f.Tag, f.What = "pending", fmt.Sprintf("stream seq %d not yet settled by durable %s (waiting, delivered and unacked, or being retried)", seq, durable)
		}
		out = append(out, f)
	}
	return out, nil
}

func effectHop(ctx context.Context, s *Sources, q *Query) ([]Fact, error) {
	return eachDB(ctx, s, func(d db, where string) ([]Fact, error) {
		var out []Fact
		for _, id := range q.IDs {
			rows, done, err := d.query(ctx, `SELECT account, amount, created_at FROM ledger_entries WHERE scope = $1 AND message_id = $2 LIMIT 50`, s.Scope, id)
			if err != nil {
				return out, err
			}
			for rows.Next() {
				var account, amount int64
				var at any
				if err := rows.Scan(&account, &amount, &at); err != nil {
					done()
					return out, err
				}
				out = append(out, Fact{At: when(at), Level: "ok", Tag: "effect", Source: "table ledger_entries" + where,
					What: fmt.Sprintf("ledger entry: account %d, amount %d", account, amount)})
			}
			err = rows.Err()
			done()
			if err != nil {
				return out, err
			}
		}
		return out, nil
	})
}

func followUpHop(ctx context.Context, s *Sources, q *Query) ([]Fact, error) {
	return eachDB(ctx, s, func(d db, where string) ([]Fact, error) {
		var out []Fact
		for _, id := range q.IDs {
			rows, done, err := d.query(ctx, `SELECT id, subject, created_at, sent_at, coalesce(failed, '') FROM outbox WHERE parent_id = $1 LIMIT 20`, id)
			if err != nil {
				return out, err
			}
			for rows.Next() {
				var fid, subject, failed string
				var created, sent any
				if err := rows.Scan(&fid, &subject, &created, &sent, &failed); err != nil {
					done()
					return out, err
				}
				state := "published at " + fmtTime(when(sent))
				level := "ok"
				switch {
				case failed != "":
					state, level = "FAILED: "+Safe([]byte(failed), 1000), "bad"
				case sent == nil:
					state, level = "pending in the outbox", "info"
				}
				out = append(out, Fact{At: when(created), Level: level, Source: "table outbox" + where,
					What: fmt.Sprintf("follow-up %s on %s: %s", Safe([]byte(fid), 200), Safe([]byte(subject), 300), state)})
			}
			err = rows.Err()
			done()
			if err != nil {
				return out, err
			}
		}
		return out, nil
	})
}

func (c *Console) intent(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimSpace(r.URL.Query().Get("id"))
	key := strings.TrimSpace(r.URL.Query().Get("key"))
	if len(id) > 1024 || len(key) > 1024 {
		c.fail(w, r, http.StatusBadRequest, "an ID or key that long is no intent's")
		return
	}
	if id == "" && key == "" {
		c.render(w, r, "intent", nil)
		return
	}
	if k, err := idempotency.ParseKey(key); key != "" && err == nil {
		key = k
	}
	c.render(w, r, "intent", c.timeline(r.Context(), id, key))
}
