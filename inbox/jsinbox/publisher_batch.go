// Atomic batches: intents gathered into JetStream atomic batches (ADR-50),
// one fsync and one PubAck a batch, and their fallback to one by one.

package jsinbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/jetinbox/jetinbox/internal/hook"
)

// gatherBatches gathers intents into atomic batches: a batch goes out when it
// is full or when its first intent has waited Linger.
func (p *Publisher) gatherBatches() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var cur []*tracker
	for {
		select {
		case t := <-p.batchIn:
			if len(cur) == 0 {
				timer.Reset(p.cfg.Linger)
			}
			cur = append(cur, t)
			if len(cur) < p.cfg.Batch {
				continue
			}
		case <-timer.C:
		case <-p.ctx.Done():
			for _, t := range cur {
				t.retry(p.ctx.Err())
			}
			return
		}
		if len(cur) > 0 {
			timer.Stop()
			p.sendBatch(cur)
			cur = nil
		}
	}
}

// Headers of JetStream's atomic batch publishing (ADR-50).
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// sendBatch publishes ts as one atomic batch: every message but the last
// without a reply, the last with the commit header as a request whose
// reply is the batch's PubAck. Each message keeps its headers: the server
// checks Nats-Msg-Id (and Nats-Expected-Stream, if sent) on every message of
// an atomic batch and refuses the whole batch if one fails (an ID it holds,
// another stream). A message whose subject another stream captures leaves
// the batch incomplete in ours, which refuses it too. The intents then go
// one by one, where each gets its own verdict.
func (p *Publisher) sendBatch(ts []*tracker) {
	if p.noBatch.Load() {
		for _, t := range ts {
			t.send()
		}
		return
	}
	nc := p.js.Conn()
	id := nuid.Next()
	for i, t := range ts {
		t.attempts++
		h := make(nats.Header, len(t.header)+3)
		for k, v := range t.header {
			h[k] = v
		}
		h[batchIDHeader] = []string{id}
		h[batchSeqHeader] = []string{strconv.Itoa(i + 1)}
		msg := &nats.Msg{Subject: t.in.Subject, Data: t.in.Payload, Header: h}
		if i < len(ts)-1 {
			// An error here leaves the batch incomplete: the server
			// refuses the commit and every intent goes again on its own.
			_ = nc.PublishMsg(msg)
			continue
		}
		h[batchCommitHeader] = []string{"1"}
		go func() {
			resp, err := nc.RequestMsg(msg, p.cfg.AckTimeout)
			p.settleBatch(ts, resp, err)
		}()
	}
}

// batchAck is the PubAck of an atomic batch, or its error.
type batchAck struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	Count  int    `json:"count"`
	Error  *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// errAtomicDisabled is JetStream's error code for a batch sent to a stream
// that does not allow atomic publishing.
const errAtomicDisabled = 10174

// settleBatch settles a batch from its commit's reply. Stored: every
// intent is published. Refused, lost or late: every intent is published
// again on its own with its ID, and the stream's duplicate window drops
// those it already stored.
func (p *Publisher) settleBatch(ts []*tracker, resp *nats.Msg, err error) {
	var ack batchAck
	if err == nil {
		if jerr := json.Unmarshal(resp.Data, &ack); jerr != nil {
			err = fmt.Errorf("batch PubAck: %w", jerr)
		} else if ack.Error != nil {
			err = fmt.Errorf("batch refused: %s (%d)", ack.Error.Description, ack.Error.ErrCode)
		} else if ack.Count != len(ts) {
			err = fmt.Errorf("batch PubAck counts %d of %d messages", ack.Count, len(ts))
		} else if ack.Stream != p.cfg.Stream {
			// Each intent goes again on its own and fails with
			// ErrWrongStream there.
			err = fmt.Errorf("batch stored by stream %q, not %q", ack.Stream, p.cfg.Stream)
		}
	}
	if err == nil && p.hook != nil && p.hook(hook.LosePubAck) {
		err = errors.New("batch PubAck lost (simulated)")
	}
	if err == nil {
		p.batches.Add(1)
		for _, t := range ts {
			p.published.Add(1)
			t.done()
		}
		return
	}
	if ack.Error != nil && ack.Error.ErrCode == errAtomicDisabled && !p.noBatch.Swap(true) {
		p.cfg.Logger.Warn("jsinbox: the stream does not allow atomic batches; publishing one intent at a time", "subject", ts[0].in.Subject)
	}
	p.batchFallbacks.Add(1)
	p.cfg.Logger.Debug("jsinbox: batch not stored as a whole; publishing its intents one at a time", "size", len(ts), "err", err)
	for _, t := range ts {
		t.send()
	}
}
