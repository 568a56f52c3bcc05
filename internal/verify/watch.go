// Watch: verify as a long-running process, a round at a time, from a
// checkpoint up to what the durable has settled.

package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// Metric names of the watch, which the JetinboxVerifyViolations alert and
// the dashboard's verify panel read.
const (
	MetricViolations = "jetinbox_verify_violations"
	MetricChecked    = "jetinbox_verify_checked_messages_total"
	MetricLastRun    = "jetinbox_verify_last_run_timestamp_seconds"
	MetricCheckpoint = "jetinbox_verify_checkpoint_sequence"
	MetricErrors     = "jetinbox_verify_round_errors_total"
)

// Checkpoint is what a watch keeps between rounds and restarts: the last
// stream sequence checked, and what was found up to it. Its size does not
// grow with the stream.
type Checkpoint struct {
	Stream string `json:"stream"`
	Scope  string `json:"scope"`
	// Seq is the last stream sequence checked: the next round starts
	// after it.
	Seq uint64 `json:"seq"`
	// Checked counts the stream messages checked so far.
	Checked uint64 `json:"checked"`
	// Violations counts the violations found so far, by kind.
	Violations map[string]int `json:"violations"`
	// Examples are the first violations found, for people.
	Examples []string `json:"examples,omitempty"`
}

// Watch verifies a stream incrementally: each Round checks the messages
// after the checkpoint up to the durable's ack floor as the previous round
// saw it, so only settled messages are judged, and each of them had at
// least one interval after it was settled for a rescue to finish. A
// message is judged once, when settled: an effect tampered with later is
// found by a full `jetinbox verify`, not by the watch. Ledger entries and
// inbox rows of IDs that are in no stream message (unexpected) and
// balances are not judged either: they need the whole tables.
type Watch struct {
	opts Options
	js   jetstream.JetStream
	db   DB
	// path, if set, is where the checkpoint is kept across restarts.
	path string

	mu     sync.Mutex
	cp     Checkpoint
	bound  uint64 // the ack floor the previous round saw
	lastOK time.Time

	violations *prometheus.GaugeVec
	checked    prometheus.Counter
	lastRun    prometheus.Gauge
	seq        prometheus.Gauge
	errs       prometheus.Counter
}

// NewWatch makes a watch of o.Stream for o.Scope, judged against the
// settled messages of o.Durable (required). With path, the checkpoint is
// read from that file if it exists and written after each round; without,
// a restart checks the stream again from its first message, which costs
// time, not correctness. o.Range is ignored.
func NewWatch(js jetstream.JetStream, pool *pgxpool.Pool, o Options, path string) (*Watch, error) {
	return NewWatchOn(js, Postgres(pool), o, path)
}

// NewWatchOn is [NewWatch] on any store's database.
func NewWatchOn(js jetstream.JetStream, db DB, o Options, path string) (*Watch, error) {
	if o.Stream == "" {
		o.Stream = jsinbox.DefaultStream
	}
	if o.Scope == "" {
		o.Scope = "ledger"
	}
	if o.Durable == "" {
		return nil, errors.New("verify: watch: a durable is required (its ack floor says what is settled)")
	}
	o.Range, o.Progress = Range{}, nil
	w := &Watch{opts: o, js: js, db: db, path: path,
		cp: Checkpoint{Stream: o.Stream, Scope: o.Scope, Violations: map[string]int{}},
		violations: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricViolations,
			Help: "Broken invariants found by jetinbox verify, by kind (lost, duplicated, unexpected, effect_without_row, row_without_effect, balance_mismatch), since the checkpoint began."},
			[]string{"kind"}),
		checked: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricChecked, Help: "Stream messages checked by jetinbox verify -watch."}),
		lastRun: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricLastRun, Help: "When jetinbox verify last finished a round without error."}),
		seq:     prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricCheckpoint, Help: "The last stream sequence jetinbox verify -watch checked."}),
		errs:    prometheus.NewCounter(prometheus.CounterOpts{Name: MetricErrors, Help: "Rounds of jetinbox verify -watch that failed (and will be retried)."}),
	}
	if path != "" {
		b, err := os.ReadFile(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("verify: checkpoint: %w", err)
		default:
			var cp Checkpoint
			if err := json.Unmarshal(b, &cp); err != nil {
				return nil, fmt.Errorf("verify: checkpoint %s: %w", path, err)
			}
			if cp.Stream != o.Stream || cp.Scope != o.Scope {
				return nil, fmt.Errorf("verify: checkpoint %s is for stream %s and scope %q, not %s and %q", path, cp.Stream, cp.Scope, o.Stream, o.Scope)
			}
			if cp.Violations == nil {
				cp.Violations = map[string]int{}
			}
			w.cp = cp
		}
	}
	for _, k := range ViolationKinds {
		w.violations.WithLabelValues(k).Set(float64(w.cp.Violations[k]))
	}
	w.checked.Add(float64(w.cp.Checked))
	w.seq.Set(float64(w.cp.Seq))
	return w, nil
}

// Register adds the watch's metrics to reg.
func (w *Watch) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{w.violations, w.checked, w.lastRun, w.seq, w.errs} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("verify: metrics: %w", err)
		}
	}
	return nil
}

// Checkpoint returns a copy of the current checkpoint.
func (w *Watch) Checkpoint() Checkpoint {
	w.mu.Lock()
	defer w.mu.Unlock()
	cp := w.cp
	cp.Violations = make(map[string]int, len(w.cp.Violations))
	for k, v := range w.cp.Violations {
		cp.Violations[k] = v
	}
	cp.Examples = append([]string(nil), w.cp.Examples...)
	return cp
}

// LastOK returns when a round last succeeded (zero: never).
func (w *Watch) LastOK() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastOK
}

// Round checks the messages settled since the checkpoint and returns the
// report of that range (nil when there was nothing new to check).
func (w *Watch) Round(ctx context.Context) (*Report, error) {
	r, err := w.round(ctx)
	if err != nil {
		w.errs.Inc()
	}
	return r, err
}

func (w *Watch) round(ctx context.Context) (*Report, error) {
	c, err := w.js.Consumer(ctx, w.opts.Stream, w.opts.Durable)
	if err != nil {
		return nil, fmt.Errorf("verify: watch: durable %s on %s: %w", w.opts.Durable, w.opts.Stream, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("verify: watch: durable %s on %s: %w", w.opts.Durable, w.opts.Stream, err)
	}
	floor := info.AckFloor.Stream
	s, err := w.js.Stream(ctx, w.opts.Stream)
	if err != nil {
		return nil, fmt.Errorf("verify: watch: stream %s: %w", w.opts.Stream, err)
	}
	// Messages the server gave up on and that aged out unsettled keep the
	// durable's ack floor below them for good; nothing is left of them in
	// the stream to settle, only their expired records to count.
	if first := s.CachedInfo().State.FirstSeq; first > 0 {
		floor = max(floor, first-1)
	}
	// Rescues still under way (max-deliveries advisories not yet settled):
	// what they hold may be below the floor; judge nothing new this round.
	if rc, err := w.js.Consumer(ctx, jsinbox.AdvisoryStream(w.opts.Stream), w.opts.Durable); err == nil {
		if ri, err := rc.Info(ctx); err == nil && ri.NumPending+uint64(ri.NumAckPending) > 0 {
			floor = min(floor, w.bound)
		}
	}

	w.mu.Lock()
	from, to := w.cp.Seq+1, w.bound
	w.mu.Unlock()
	// Messages that aged out of the stream before they were checked cannot
	// be checked any more, but the range still starts at the checkpoint:
	// the expired records of messages given up on and aged out before
	// their rescue name sequences below the stream's first one.
	var r *Report
	if to >= from {
		o := w.opts
		o.Range = Range{FromSeq: from, ToSeq: to}
		if r, err = RunOn(ctx, w.js, w.db, o); err != nil {
			return nil, err
		}
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if r != nil {
		w.cp.Seq = to
		w.cp.Checked += uint64(r.StreamMessages)
		w.checked.Add(float64(r.StreamMessages))
		for k, n := range r.Violations() {
			w.cp.Violations[k] += n
			w.violations.WithLabelValues(k).Set(float64(w.cp.Violations[k]))
		}
		for _, e := range r.Examples {
			if len(w.cp.Examples) < 20 {
				w.cp.Examples = append(w.cp.Examples, e)
			}
		}
		w.seq.Set(float64(w.cp.Seq))
		if err := w.save(); err != nil {
			return nil, err
		}
	}
	w.bound = max(w.bound, floor)
	w.lastOK = time.Now()
	w.lastRun.SetToCurrentTime()
	return r, nil
}

// save writes the checkpoint file atomically (a temporary file renamed).
func (w *Watch) save() error {
	if w.path == "" {
		return nil
	}
	b, err := json.MarshalIndent(w.cp, "", "  ")
	if err != nil {
		return fmt.Errorf("verify: checkpoint: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(w.path), ".verify-checkpoint-*")
	if err != nil {
		return fmt.Errorf("verify: checkpoint: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("verify: checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("verify: checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), w.path); err != nil {
		return fmt.Errorf("verify: checkpoint: %w", err)
	}
	return nil
}
