package pginbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/metrics"
)

// causeHandler applies intents with the ledger, except for messages whose
// IDs ask for a failure.
func causeHandler() inbox.Handler[pgx.Tx] {
	ledger := effects.NewLedger()
	return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		switch {
		case strings.HasPrefix(m.ID, "panics"):
			panic("boom")
		case strings.HasPrefix(m.ID, "refuses"):
			return inbox.Permanent(errors.New("no such customer"))
		case strings.HasPrefix(m.ID, "unreadable"):
			// Bad input without Permanent: still permanent.
			return fmt.Errorf("reading it: %w", inbox.ErrBadInput)
		case strings.HasPrefix(m.ID, "aborts"):
			_, err := tx.Exec(ctx, "SELECT 1/0") // a data error: this message's own
			return err
		case strings.HasPrefix(m.ID, "transient"):
			return errors.New("downstream busy")
		}
		errs := make([]error, 1)
		if err := ledger.Handle(ctx, tx, []inbox.Message{m}, errs); err != nil {
			return err
		}
		return errs[0]
	})
}

// TestOutcomeCauses: every way the processor decides an outcome sets its
// Cause, and metrics label rejections by it.
func TestOutcomeCauses(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	p, err := inbox.NewProcessor(pginbox.New(pool), causeHandler(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := p.Process(ctx, []inbox.Message{intent("dup", 1, 5), intent("conflict", 1, 5), {ID: "rejected", Payload: []byte(`{`)}}); err != nil || statuses(out) != "applied,applied,rejected" {
		t.Fatalf("setup batch: %s, %v", statuses(out), err)
	}
	// The database refuses this one claim; the checks before it cannot know.
	if _, err := pool.Exec(ctx, `ALTER TABLE inbox ADD CONSTRAINT no_refused CHECK (message_id <> 'refused-claim')`); err != nil {
		t.Fatal(err)
	}
	final := intent("transient-final", 1, 5)
	final.Final, final.Deliveries = true, 20
	cases := []struct {
		msg    inbox.Message
		status inbox.Status
		cause  inbox.Cause
		label  string // metrics label of a rejection
	}{
		{intent("fresh", 1, 5), inbox.StatusApplied, inbox.CauseNone, ""},
		{intent("dup", 1, 5), inbox.StatusDuplicate, inbox.CauseNone, ""},
		{intent("panics", 1, 5), inbox.StatusRejected, inbox.CausePanic, "panic"},
		{final, inbox.StatusRejected, inbox.CauseGaveUp, "gave_up"},
		{intent("transient", 1, 5), inbox.StatusRetry, inbox.CauseTransient, ""},
		{inbox.Message{ID: "bad-json", Payload: []byte(`{"account":1,`)}, inbox.StatusRejected, inbox.CauseBadInput, "bad_input"},
		{intent("unknown-account", 99999, 5), inbox.StatusRejected, inbox.CauseBadInput, "bad_input"},
		{intent("unreadable", 1, 5), inbox.StatusRejected, inbox.CauseBadInput, "bad_input"},
		{intent("refuses", 1, 5), inbox.StatusRejected, inbox.CausePermanent, "permanent"},
		{intent("aborts", 1, 5), inbox.StatusRejected, inbox.CausePermanent, "permanent"},
		{inbox.Message{ID: "has space", Payload: []byte(`{}`)}, inbox.StatusRejected, inbox.CauseInvalidID, "invalid_id"},
		{inbox.Message{ID: "nul-subject", Subject: "intents.\x00", Payload: []byte(`{}`)}, inbox.StatusRejected, inbox.CauseInvalidSubject, "invalid_subject"},
		{intent("refused-claim", 1, 5), inbox.StatusRejected, inbox.CauseClaimRefused, "claim_refused"},
		{intent("conflict", 1, 6), inbox.StatusConflict, inbox.CauseConflict, "conflict"},
		{inbox.Message{ID: "rejected", Payload: []byte(`{`)}, inbox.StatusRejected, inbox.CauseRejectedBefore, ""},
		// A copy of the bad-JSON message in the same batch shares its fate.
		{inbox.Message{ID: "bad-json", Payload: []byte(`{"account":1,`)}, inbox.StatusRejected, inbox.CauseBadInput, "bad_input"},
	}
	batch := make([]inbox.Message, len(cases))
	for i, c := range cases {
		batch[i] = c.msg
	}
	out, err := p.Process(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		o := out[i]
		if o.Status != c.status || o.Cause != c.cause {
			t.Errorf("%q: %v/%v (%s), want %v/%v", c.msg.ID, o.Status, o.Cause, o.Reason, c.status, c.cause)
		}
		if c.label != "" {
			if got := metrics.RejectReason(o); got != c.label {
				t.Errorf("%q: metrics label %s, want %s", c.msg.ID, got, c.label)
			}
		}
	}
	// The panic's value; its stack goes to the log (TestReasonsAreBoundedLines).
	if r := out[2].Reason; r != "inbox: effect panicked: boom" {
		t.Errorf("panic reason %q", r)
	}
	if r := out[3].Reason; !strings.HasPrefix(r, "gave up after 20 deliveries: downstream busy") {
		t.Errorf("give-up reason %q", r)
	}
	if r := out[5].Reason; !strings.HasPrefix(r, "effects: bad intent: ") || !errors.Is(out[5].Err, effects.ErrBadIntent) {
		t.Errorf("bad input reason %q, err %v: the ledger's wording and error chain are kept", r, out[5].Err)
	}
}

// TestBatchFailedCause: a batch that cannot commit retries every message
// with CauseBatchFailed.
func TestBatchFailedCause(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := inbox.NewProcessor(pginbox.New(pool), causeHandler(), inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	out, err := p.Process(context.Background(), []inbox.Message{intent("a", 1, 5), {ID: "", Payload: []byte(`{}`)}})
	if err == nil {
		t.Fatal("Process on a closed pool succeeded")
	}
	if out[0].Status != inbox.StatusRetry || out[0].Cause != inbox.CauseBatchFailed {
		t.Errorf("failed batch: %v/%v, want retry/batch_failed", out[0].Status, out[0].Cause)
	}
	if out[1].Cause != inbox.CauseInvalidID {
		t.Errorf("invalid ID in a failed batch: %v, want invalid_id", out[1].Cause)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	if inbox.BadInput(nil) != nil {
		t.Error("BadInput(nil) is not nil")
	}
	base := errors.New("amount -5 must be positive")
	err := inbox.BadInput(base)
	if err.Error() != base.Error() || !errors.Is(err, base) || !errors.Is(err, inbox.ErrBadInput) || !inbox.IsPermanent(err) {
		t.Errorf("BadInput(%v) = %v: want the same text, both in its chain, permanent", base, err)
	}
	if !inbox.IsPermanent(fmt.Errorf("x: %w", inbox.ErrBadInput)) {
		t.Error("an error wrapping ErrBadInput is not permanent")
	}
}

func TestCauseString(t *testing.T) {
	t.Parallel()
	for c, want := range map[inbox.Cause]string{inbox.CauseNone: "none", inbox.CauseBadInput: "bad_input", inbox.CauseBatchFailed: "batch_failed", 200: "Cause(200)"} {
		if got := c.String(); got != want {
			t.Errorf("Cause(%d).String() = %s, want %s", uint8(c), got, want)
		}
	}
}
