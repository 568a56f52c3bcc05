package console

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/cli"
	"github.com/jetinbox/jetinbox/internal/dlq"
	"github.com/jetinbox/jetinbox/internal/jscheck"
)

// Overview is what the overview page shows.
type Overview struct {
	Errors      []string
	StreamMsgs  uint64
	StreamBytes uint64
	MaxMsgs     int64
	MaxBytes    int64
	FillMsgs    string
	FillBytes   string
	FirstSeq    uint64
	LastSeq     uint64
	MaxAge      time.Duration
	Duplicates  time.Duration

	Durable       string
	Pending       uint64
	AckPending    int
	Redelivered   int
	Waiting       int
	AckFloor      uint64
	Instances     string
	RescueBacklog string

	Inbox       []kv
	DeadTotal   int
	DeadReasons []kv
	Outbox      string
	Deliveries  string

	Horizons  []string
	HorizonOK bool
	Charts    template.HTML
}

type kv struct {
	K string
	V int64
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, "overview", c.readOverview(r.Context()))
}

func (c *Console) readOverview(ctx context.Context) *Overview {
	o := &Overview{Durable: c.cfg.Durable}
	bad := func(what string, err error) { o.Errors = append(o.Errors, what+": "+Safe([]byte(err.Error()), 500)) }
	var streamCfg *jetstream.StreamConfig
	var consumerCfg *jetstream.ConsumerConfig
	if s, err := c.cfg.JS.Stream(ctx, c.cfg.Stream); err != nil {
		bad("stream "+c.cfg.Stream, err)
	} else {
		info := s.CachedInfo()
		streamCfg = &info.Config
		o.StreamMsgs, o.StreamBytes, o.FirstSeq, o.LastSeq = info.State.Msgs, info.State.Bytes, info.State.FirstSeq, info.State.LastSeq
		o.MaxMsgs, o.MaxBytes, o.MaxAge, o.Duplicates = info.Config.MaxMsgs, info.Config.MaxBytes, info.Config.MaxAge, info.Config.Duplicates
		o.FillMsgs, o.FillBytes = pct(float64(o.StreamMsgs), float64(o.MaxMsgs)), pct(float64(o.StreamBytes), float64(o.MaxBytes))
	}
	durables := []string{c.cfg.Durable}
	if c.cfg.Shards != nil {
		durables = c.cfg.Shards.ConsumerDurables()
		o.Durable = fmt.Sprintf("%d partition durables", len(durables))
		if c.cfg.Shards.ShardDurables {
			o.Durable = fmt.Sprintf("%d shard durables", len(durables))
		}
	}
	var ready, total int
	for _, d := range durables {
		cons, err := c.cfg.JS.Consumer(ctx, c.cfg.Stream, d)
		if err != nil {
			bad("durable "+d, err)
			continue
		}
		info, err := cons.Info(ctx)
		if err != nil {
			bad("durable "+d, err)
			continue
		}
		if consumerCfg == nil {
			cfg := info.Config
			consumerCfg = &cfg
		}
		o.Pending += info.NumPending
		o.AckPending += info.NumAckPending
		o.Redelivered += info.NumRedelivered
		o.Waiting += info.NumWaiting
		o.AckFloor = max(o.AckFloor, info.AckFloor.Stream)
		total++
		if info.NumWaiting > 0 {
			ready++
		}
	}
	o.Instances = fmt.Sprintf("%d of %d durables have a consumer instance waiting for messages (%d pull requests)", ready, total, o.Waiting)
	if rc, err := c.cfg.JS.Consumer(ctx, jsinbox.AdvisoryStream(c.cfg.Stream), c.cfg.Durable); err == nil {
		if info, err := rc.Info(ctx); err == nil {
			o.RescueBacklog = fmt.Sprintf("%d max-deliveries advisories not settled yet", info.NumPending+uint64(info.NumAckPending))
		}
	}
	if o.RescueBacklog == "" {
		o.RescueBacklog = "no rescue durable found"
	}
	for _, sd := range c.sources().DBs {
		d := sd.db()
		rows, done, err := d.query(ctx, `SELECT status, count(*) FROM inbox WHERE scope = $1 GROUP BY status ORDER BY status`, c.cfg.Scope)
		if err != nil {
			bad("inbox", err)
			continue
		}
		for rows.Next() {
			var k string
			var v int64
			if err := rows.Scan(&k, &v); err != nil {
				bad("inbox", err)
				break
			}
			if sd.Name != "" {
				k = sd.Name + ": " + k
			}
			o.Inbox = append(o.Inbox, kv{k, v})
		}
		done()
		st := &cli.Store{PG: sd.PG, SQLite: sd.SQLite}
		n, age, err := cli.RelayBacklog(st)(ctx)
		switch {
		case missingTable(err):
		case err != nil:
			bad("outbox", err)
		default:
			o.Outbox += fmt.Sprintf("%d pending rows, oldest %s old. ", n, age.Round(time.Second))
		}
	}
	if o.Outbox == "" {
		o.Outbox = "no outbox table"
	}
	if msg, err := deliveryBacklog(ctx, c.sources()); err != nil {
		bad("outgoing calls", err)
	} else if o.Deliveries = msg; msg == "" {
		o.Deliveries = "no deliveries table"
	}
	dead, err := dlq.ReadDirect(ctx, c.cfg.JS, c.cfg.Stream, c.cfg.Scope)
	if err != nil && !strings.Contains(err.Error(), "not found") {
		bad("dead letters", err)
	}
	o.DeadTotal = len(dead)
	o.DeadReasons = reasons(dead)
	if streamCfg != nil {
		h := jscheck.HorizonOptions{Retention: c.cfg.Retention, Redrive: true}
		if ds, err := c.cfg.JS.Stream(ctx, jsinbox.DeadLetterStream(c.cfg.Stream)); err == nil {
			cfg := ds.CachedInfo().Config
			h.DeadLetters = &cfg
		}
		o.Horizons = jscheck.CheckHorizons(*streamCfg, consumerCfg, h)
		o.HorizonOK = len(o.Horizons) == 0
	}
	c.sample(o)
	o.Charts = c.chartsHTML()
	return o
}

// reasons counts dead letters by status and reason, most first.
func reasons(dead []dlq.Letter) []kv {
	counts := map[string]int64{}
	for _, d := range dead {
		counts[Safe([]byte(d.Status), 40)+": "+Safe([]byte(dlq.Shorten(d.Reason, 120)), 200)]++
	}
	out := make([]kv, 0, len(counts))
	for k, v := range counts {
		out = append(out, kv{k, v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].V != out[j].V {
			return out[i].V > out[j].V
		}
		return out[i].K < out[j].K
	})
	return out
}

// samples keeps the last points of the charts: taken whenever the
// overview or its charts are read, at most one per second.
type samples struct {
	at      []time.Time
	lastSeq []uint64
	floor   []uint64
	lag     []uint64
}

const maxSamples = 120

func (c *Console) sample(o *Overview) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.samples
	now := time.Now()
	if n := len(s.at); n > 0 && now.Sub(s.at[n-1]) < time.Second {
		return
	}
	s.at = append(s.at, now)
	s.lastSeq = append(s.lastSeq, o.LastSeq)
	s.floor = append(s.floor, o.AckFloor)
	s.lag = append(s.lag, o.Pending+uint64(o.AckPending))
	if len(s.at) > maxSamples {
		s.at, s.lastSeq, s.floor, s.lag = s.at[1:], s.lastSeq[1:], s.floor[1:], s.lag[1:]
	}
}

// charts serves the charts alone, for the page's refresh script.
func (c *Console) charts(w http.ResponseWriter, r *http.Request) {
	o := &Overview{}
	ctx := r.Context()
	if s, err := c.cfg.JS.Stream(ctx, c.cfg.Stream); err == nil {
		o.LastSeq = s.CachedInfo().State.LastSeq
	}
	durables := []string{c.cfg.Durable}
	if c.cfg.Shards != nil {
		durables = c.cfg.Shards.ConsumerDurables()
	}
	for _, d := range durables {
		if cons, err := c.cfg.JS.Consumer(ctx, c.cfg.Stream, d); err == nil {
			info := cons.CachedInfo()
			o.Pending += info.NumPending
			o.AckPending += info.NumAckPending
			o.AckFloor = max(o.AckFloor, info.AckFloor.Stream)
		}
	}
	c.sample(o)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write([]byte(c.chartsHTML()))
}

// chartsHTML draws the rate and lag charts as inline SVG, from numbers
// only (nothing hostile reaches them).
func (c *Console) chartsHTML() template.HTML {
	c.mu.Lock()
	s := c.samples
	at := append([]time.Time(nil), s.at...)
	var pub, settle, lag []float64
	for i := 1; i < len(at); i++ {
		dt := at[i].Sub(at[i-1]).Seconds()
		pub = append(pub, float64(sat(s.lastSeq[i], s.lastSeq[i-1]))/dt)
		settle = append(settle, float64(sat(s.floor[i], s.floor[i-1]))/dt)
	}
	for _, v := range s.lag {
		lag = append(lag, float64(v))
	}
	c.mu.Unlock()
	var b strings.Builder
	b.WriteString(`<div class="chart"><h3>rate (messages/s): published <span class="k1">■</span> settled <span class="k2">■</span></h3>`)
	b.WriteString(svg([][]float64{pub, settle}))
	b.WriteString(`</div><div class="chart"><h3>lag (pending + ack pending)</h3>`)
	b.WriteString(svg([][]float64{lag}))
	b.WriteString(`</div>`)
	return template.HTML(b.String()) // built from numbers only
}

func sat(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func svg(series [][]float64) string {
	const w, h = 360.0, 100.0
	top := 1.0
	n := 0
	for _, s := range series {
		for _, v := range s {
			top = max(top, v)
		}
		n = max(n, len(s))
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img">`, w, h+14, w, h+14)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%.0f" height="%.0f" class="bg"/>`, w, h)
	for i, s := range series {
		if len(s) == 0 {
			continue
		}
		b.WriteString(`<polyline class="s` + fmt.Sprint(i+1) + `" points="`)
		for j, v := range s {
			x := 0.0
			if n > 1 {
				x = float64(j) * w / float64(n-1)
			}
			fmt.Fprintf(&b, "%.1f,%.1f ", x, h-v/top*(h-4))
		}
		b.WriteString(`"/>`)
	}
	last := 0.0
	if len(series[0]) > 0 {
		last = series[0][len(series[0])-1]
	}
	fmt.Fprintf(&b, `<text x="2" y="%.0f">max %.0f, now %.0f, %d samples</text></svg>`, h+12, top, last, n)
	return b.String()
}
