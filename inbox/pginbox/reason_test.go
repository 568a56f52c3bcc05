package pginbox_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// TestReasonsAreBoundedLines: a handler that panics with a long,
// multi-line value gets a rejection whose reason, in the outcome and in
// the inbox row, is one line of at most MaxReasonLen bytes without the
// stack; the stack is in the log.
func TestReasonsAreBoundedLines(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	ctx := context.Background()
	var logs testenv.SyncBuffer
	huge := "first line\nsecond\tline\x1b[31m" + strings.Repeat("é", 4000)
	p, err := inbox.NewProcessor(pginbox.New(pool), inbox.HandlerFunc(func(context.Context, pgx.Tx, inbox.Message) error { panic(huge) }), inbox.Config{Scope: "ledger", Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Process(ctx, []inbox.Message{intent("panics", 1, 5)})
	if err != nil || len(out) != 1 || out[0].Status != inbox.StatusRejected {
		t.Fatalf("outcomes %+v, %v", out, err)
	}
	var row string
	if err := pool.QueryRow(ctx, `SELECT reason FROM inbox WHERE scope = 'ledger' AND message_id = 'panics'`).Scan(&row); err != nil {
		t.Fatal(err)
	}
	for what, r := range map[string]string{"outcome": out[0].Reason, "row": row} {
		if len(r) > inbox.MaxReasonLen || !utf8.ValidString(r) || strings.ContainsAny(r, "\n\r\t\x1b") ||
			strings.Contains(r, "goroutine ") || !strings.Contains(r, "first line second line") {
			t.Errorf("%s reason (%d bytes): %q; want one line of at most %d bytes, no stack", what, len(r), r, inbox.MaxReasonLen)
		}
	}
	if l := logs.String(); !strings.Contains(l, "goroutine ") || !strings.Contains(l, "the effect panicked") {
		t.Errorf("the stack is not in the log:\n%.2000s", l)
	}
	for in, want := range map[string]string{"": "", " a \r\n b ": "a b", "ok": "ok", strings.Repeat("x", 600): strings.Repeat("x", inbox.MaxReasonLen-3) + "…"} {
		if got := inbox.SanitizeReason(in); got != want {
			t.Errorf("SanitizeReason(%.20q) = %.40q, want %.40q", in, got, want)
		}
	}
}
