package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jetinbox/jetinbox/internal/dlq"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// letterView is a dead letter as a page shows it: every string made safe.
type letterView struct {
	Seq, OrigSeq        uint64
	ID, Status, Reason  string
	Subject, Deliveries string
	At                  time.Time
	Headers             []kv2
	Payload             string
	PayloadLen          int
}

type kv2 struct{ K, V string }

// maxPayload bounds the payload shown on a dead letter's page.
const maxPayload = 64 << 10

func viewLetter(d dlq.Letter, whole bool) letterView {
	v := letterView{Seq: d.Seq, OrigSeq: d.OrigSeq, ID: Safe([]byte(d.ID), 300), Status: Safe([]byte(d.Status), 40),
		Reason: Safe([]byte(d.Reason), 160), Subject: Safe([]byte(d.Subject), 300), Deliveries: Safe([]byte(d.Deliveries), 20),
		At: d.DeadLetteredAt, PayloadLen: len(d.Payload)}
	if whole {
		v.Reason = Safe([]byte(d.Reason), 4096)
		v.Payload = Safe(d.Payload, maxPayload)
		keys := make([]string, 0, len(d.Header))
		for k := range d.Header {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v.Headers = append(v.Headers, kv2{Safe([]byte(k), 200), Safe([]byte(strings.Join(d.Header[k], ", ")), 2048)})
		}
	}
	return v
}

type dlqPage struct {
	Total   int
	Reasons []kv
	Letters []letterView
	Filter  string
	Status  string
	Shown   int
	Err     string
}

// maxListed bounds the dead letters one page lists.
const maxListed = 500

func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := dlqPage{Filter: q.Get("q"), Status: q.Get("status")}
	dead, err := dlq.ReadDirect(r.Context(), c.cfg.JS, c.cfg.Stream, c.cfg.Scope)
	if err != nil {
		p.Err = Safe([]byte(err.Error()), 1000)
	}
	p.Total = len(dead)
	p.Reasons = reasons(dead)
	for _, d := range dead {
		if p.Status != "" && d.Status != p.Status {
			continue
		}
		if p.Filter != "" && !strings.Contains(d.Reason, p.Filter) && !strings.Contains(d.ID, p.Filter) {
			continue
		}
		p.Shown++
		if len(p.Letters) < maxListed {
			p.Letters = append(p.Letters, viewLetter(d, false))
		}
	}
	c.render(w, r, "dlq", p)
}

func (c *Console) deadLetter(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseUint(r.URL.Query().Get("seq"), 10, 64)
	if err != nil || seq == 0 {
		c.fail(w, r, http.StatusBadRequest, "seq: want a dead-letter stream sequence")
		return
	}
	dead, err := dlq.ReadDirect(r.Context(), c.cfg.JS, c.cfg.Stream, c.cfg.Scope)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, Safe([]byte(err.Error()), 1000))
		return
	}
	for _, d := range dead {
		if d.Seq == seq {
			c.render(w, r, "dlqshow", viewLetter(d, true))
			return
		}
	}
	c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no dead letter of scope %s at sequence %d", Safe([]byte(c.cfg.Scope), 100), seq))
}

// picked reads the form's selected dead-letter sequences and returns those
// dead letters, in stream order, through the dlq package's selection.
func (c *Console) picked(r *http.Request) ([]dlq.Letter, string, error) {
	seqs := r.PostForm["seq"]
	if len(seqs) == 0 || len(seqs) > maxListed {
		return nil, "", fmt.Errorf("select between 1 and %d dead letters", maxListed)
	}
	sel, err := dlq.NewSelection(false, "", strings.Join(seqs, ","), "")
	if err != nil {
		return nil, "", err
	}
	dead, err := dlq.ReadDirect(r.Context(), c.cfg.JS, c.cfg.Stream, c.cfg.Scope)
	if err != nil {
		return nil, "", err
	}
	var out []dlq.Letter
	for _, d := range dead {
		if sel.Match(d) {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, "", fmt.Errorf("none of the selected dead letters is in %s any more", c.cfg.Stream)
	}
	return out, strings.Join(seqs, ","), nil
}

type confirmPage struct {
	Letters []letterView
	Seqs    []uint64
}

func (c *Console) confirmRedrive(w http.ResponseWriter, r *http.Request) {
	if !c.operator(w, r) {
		return
	}
	picked, _, err := c.picked(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, Safe([]byte(err.Error()), 1000))
		return
	}
	p := confirmPage{}
	for _, d := range picked {
		p.Letters = append(p.Letters, viewLetter(d, false))
		p.Seqs = append(p.Seqs, d.Seq)
	}
	c.render(w, r, "confirm", p)
}

type redrivenPage struct {
	Output string
	Err    string
}

func (c *Console) redrive(w http.ResponseWriter, r *http.Request) {
	if !c.operator(w, r) {
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		c.fail(w, r, http.StatusBadRequest, "a re-drive needs its confirmation page")
		return
	}
	picked, seqs, err := c.picked(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, Safe([]byte(err.Error()), 1000))
		return
	}
	rd := c.cfg.Redrive
	stream := rd.Stream
	if stream == "" {
		stream = c.cfg.Stream
	}
	var out bytes.Buffer
	store := rd.Store
	if rd.Route != nil {
		store = nil
	}
	err = dlq.Redrive(r.Context(), &out, rd.JS, store, rd.Route, stream, c.cfg.Scope, picked)
	p := redrivenPage{Output: Safe(out.Bytes(), 64<<10)}
	c.log.Info("console: re-drive", "seqs", seqs, "remote", r.RemoteAddr, "err", err)
	status := http.StatusOK
	if err != nil {
		p.Err = Safe([]byte(err.Error()), 2000)
		status = http.StatusConflict
	}
	c.renderStatus(w, r, status, "redriven", p)
}

type verifyPage struct {
	From, To   string
	Ran        bool
	Report     *verify.Report
	Clean      bool
	Err        string
	Took       time.Duration
	Checkpoint *verify.Checkpoint
	CPErr      string
	CPPath     string
}

func (c *Console) verify(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := verifyPage{From: q.Get("from"), To: q.Get("to"), CPPath: c.cfg.VerifyCheckpoint}
	if path := c.cfg.VerifyCheckpoint; path != "" {
		switch b, err := os.ReadFile(path); {
		case err != nil:
			p.CPErr = Safe([]byte(err.Error()), 500)
		default:
			var cp verify.Checkpoint
			if err := json.Unmarshal(b, &cp); err != nil {
				p.CPErr = Safe([]byte(err.Error()), 500)
			} else {
				p.Checkpoint = &cp
			}
		}
	}
	if q.Get("run") == "" {
		c.render(w, r, "verify", p)
		return
	}
	// One run at a time: a page (or another site's <img>) asking again
	// and again cannot pile full reads of the stream on the servers.
	if !c.verifying.TryLock() {
		c.fail(w, r, http.StatusTooManyRequests, "a verify run is under way; try again when it has finished")
		return
	}
	defer c.verifying.Unlock()
	p.Ran = true
	var rg verify.Range
	var err error
	if p.From != "" {
		if rg.FromSeq, err = strconv.ParseUint(p.From, 10, 64); err != nil {
			c.fail(w, r, http.StatusBadRequest, "from: want a stream sequence")
			return
		}
	}
	if p.To != "" {
		if rg.ToSeq, err = strconv.ParseUint(p.To, 10, 64); err != nil {
			c.fail(w, r, http.StatusBadRequest, "to: want a stream sequence")
			return
		}
	}
	start := time.Now()
	vdb := verify.Postgres(c.cfg.ReadPG)
	if c.cfg.ReadSQLite != nil {
		vdb = verify.SQLite(c.cfg.ReadSQLite)
	}
	if c.cfg.Shards != nil {
		// A sharded stream is verified per shard by `jetinbox verify
		// -shards`; the page checks what the configured database holds.
		p.Err = "sharded stream: run jetinbox verify -shards FILE for the whole check; this page checks the configured database only"
	}
	rep, err := verify.RunOn(r.Context(), c.cfg.JS, vdb, verify.Options{Stream: c.cfg.Stream, Scope: c.cfg.Scope, Durable: c.cfg.Durable,
		Ledger: true, Range: rg})
	p.Took = time.Since(start).Round(time.Millisecond)
	if err != nil {
		p.Err = Safe([]byte(err.Error()), 2000)
	} else {
		p.Report, p.Clean = rep, rep.Clean()
	}
	c.render(w, r, "verify", p)
}

type partitionRow struct {
	Partition int
	Durable   string
	Owner     string
	MapOwner  string
	Lag       string
	State     string
}

type partitionsPage struct {
	Sharded bool
	Rows    []partitionRow
	Errors  []string
}

func (c *Console) partitions(w http.ResponseWriter, r *http.Request) {
	m := c.cfg.Shards
	p := partitionsPage{Sharded: m != nil}
	if m == nil {
		c.render(w, r, "partitions", p)
		return
	}
	owners := map[int][]string{}
	movedTo := map[int]string{}
	for _, s := range m.Shards {
		pool := c.cfg.ShardPools[s.Name]
		if pool == nil {
			p.Errors = append(p.Errors, "shard "+s.Name+": no connection")
			continue
		}
		rows, err := shard.Rows(r.Context(), pool, m.Scope)
		if err != nil {
			p.Errors = append(p.Errors, "shard "+s.Name+": "+Safe([]byte(err.Error()), 500))
			continue
		}
		for _, row := range rows {
			if row.Owned {
				owners[row.Partition] = append(owners[row.Partition], s.Name)
			} else {
				movedTo[row.Partition] = s.Name + " → " + row.MovedTo
			}
		}
	}
	for part := range m.Partitions {
		row := partitionRow{Partition: part, Durable: m.Durable(part), Owner: strings.Join(owners[part], ", "), MapOwner: m.Owner(part), State: "ok"}
		if m.ShardDurables && len(owners[part]) == 1 {
			// Its owner's durable, which reads every partition the shard
			// owns: the lag is the shard's.
			row.Durable = m.ShardDurable(owners[part][0])
		}
		switch n := len(owners[part]); {
		case n == 0 && movedTo[part] != "":
			row.State = "move in progress (" + movedTo[part] + "): owned by no shard"
		case n == 0:
			row.State = "owned by no shard"
		case n > 1:
			row.State = "VIOLATION: owned twice"
		case !slices.Contains(owners[part], m.Owner(part)):
			row.State = "differs from the map file"
		}
		if cons, err := c.cfg.JS.Consumer(r.Context(), m.Stream, row.Durable); err == nil {
			info := cons.CachedInfo()
			row.Lag = fmt.Sprintf("%d pending, %d ack pending", info.NumPending, info.NumAckPending)
		} else {
			row.Lag = "no durable"
		}
		p.Rows = append(p.Rows, row)
	}
	c.render(w, r, "partitions", p)
}
