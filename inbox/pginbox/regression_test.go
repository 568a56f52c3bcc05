package pginbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
)

// transientFirst applies nothing and reports a transient (non-permanent) error
// for every message whose ID is "x" the first time it is seen in a call.
type transientFor struct{ id string }

func (h transientFor) Handle(ctx context.Context, tx pgx.Tx, msgs []inbox.Message, errs []error) error {
	for i := range msgs {
		if msgs[i].ID == h.id {
			errs[i] = errors.New("downstream busy, try later")
		}
	}
	return nil
}

// F1: in-batch duplicate is Ackable even though the first copy was retried
// (claim released). If both copies are deliveries of the same stream sequence
// (redelivered while buffered), the ack of the second settles the message and
// the nak of the first is void: the intent is lost.
func TestRegressionInBatchDuplicateAckedWhileFirstRetried(t *testing.T) {
	pool := newDB(t)
	p, err := inbox.NewProcessor(pginbox.New(pool), transientFor{"x"}, inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	m := intent("x", 1, 5)
	m.StreamSeq = 7
	m2 := m
	m2.Deliveries = 2
	out, err := p.Process(context.Background(), []inbox.Message{m, m2})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM inbox WHERE message_id='x'`).Scan(&n)
	t.Logf("outcomes: [%v ackable=%v] [%v ackable=%v]; inbox rows for x: %d", out[0].Status, out[0].Ackable(), out[1].Status, out[1].Ackable(), n)
	if out[0].Status == inbox.StatusRetry && out[1].Ackable() && n == 0 {
		t.Errorf("second copy ackable while first copy retried and no inbox row exists")
	}
}

// F2: statement_timeout (57014) inside one message's effect is classified as a
// connection error in handleIsolated, failing the whole batch: neighbours are
// not applied and, on their final delivery, dead-lettered as gave-up.
type slowOne struct{ id string }

func (h slowOne) Handle(ctx context.Context, tx pgx.Tx, msgs []inbox.Message, errs []error) error {
	for i := range msgs {
		if msgs[i].ID == h.id {
			if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = '20ms'`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.5)`); err != nil {
				return err
			}
		}
	}
	return effects.NewLedger().Handle(ctx, tx, msgs, errs)
}

func TestRegressionStatementTimeoutPoisonsNeighbours(t *testing.T) {
	pool := newDB(t)
	p, err := inbox.NewProcessor(pginbox.New(pool), slowOne{"slow"}, inbox.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []inbox.Message{intent("a", 1, 1), intent("slow", 2, 1), intent("b", 3, 1)}
	out, err := p.Process(context.Background(), msgs)
	var pgErr *pgconn.PgError
	errors.As(err, &pgErr)
	t.Logf("err=%v code=%v outcomes=%v %v %v", err, pgErr != nil && true, out[0].Status, out[1].Status, out[2].Status)
	if err != nil && out[0].Status == inbox.StatusRetry {
		t.Errorf("one message's statement timeout failed the whole batch; neighbours not applied")
	}
}

// F3: an account created between applySQL and unknownSQL: the intent writes
// nothing (statement snapshot) yet is reported applied (later snapshot).
type hookTx struct {
	pgx.Tx
	before func()
}

func (h hookTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if h.before != nil {
		h.before()
	}
	return h.Tx.Query(ctx, sql, args...)
}

func TestRegressionLedgerAccountCreatedConcurrently(t *testing.T) {
	pool := newDB(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	msgs := []inbox.Message{intent("n1", 5000, 7)}
	errs := make([]error, 1)
	h := hookTx{Tx: tx, before: func() {
		if _, err := pool.Exec(ctx, `INSERT INTO accounts (id) VALUES (5000)`); err != nil {
			t.Fatal(err)
		}
	}}
	if err := effects.NewLedger().Handle(ctx, h, msgs, errs); err != nil {
		t.Fatal(err)
	}
	var entries int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE message_id='n1'`).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	t.Logf("errs[0]=%v ledger entries=%d", errs[0], entries)
	if errs[0] == nil && entries == 0 {
		t.Errorf("intent reported applied but wrote no effect")
	}
}

// A HandlerFunc whose statement aborts the transaction on a batch with one
// fresh message must not fail its duplicate neighbour: the poison is
// rejected, the duplicate acked.
func TestRegressionHandlerFuncSingleAborts(t *testing.T) {
	pool := newDB(t)
	ctx := context.Background()
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if m.ID == "bad" {
			_, err := tx.Exec(ctx, `INSERT INTO accounts (id) VALUES (1)`) // 23505: aborts the transaction
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = 2`)
		return err
	})
	p, _ := inbox.NewProcessor(pginbox.New(pool), h, inbox.Config{Scope: "ledger"})
	if _, err := p.Process(ctx, []inbox.Message{intent("good", 2, 1)}); err != nil {
		t.Fatal(err)
	}
	out, err := p.Process(ctx, []inbox.Message{intent("good", 2, 1), intent("bad", 1, 1)})
	if err != nil || statuses(out) != "duplicate,rejected" {
		t.Fatalf("one fresh poison beside a duplicate: %s, %v; want duplicate,rejected", statuses(out), err)
	}
}

// An in-batch copy of a rejected message is dead-lettered too, not acked.
func TestRegressionInBatchCopyOfRejected(t *testing.T) {
	pool := newDB(t)
	p := newLedgerProcessor(t, pool)
	bad := inbox.Message{ID: "bad", Payload: []byte(`{"account":1}`)}
	out, err := p.Process(context.Background(), []inbox.Message{bad, bad, intent("ok", 1, 1), intent("ok", 1, 1)})
	if err != nil || statuses(out) != "rejected,rejected,applied,duplicate" {
		t.Fatalf("outcomes %s, %v; want rejected,rejected,applied,duplicate", statuses(out), err)
	}
}

// Both ledger paths (one statement for small batches, COPY for large ones)
// reject an unknown account alone and apply its neighbours once.
func TestLedgerUnknownAccountBothPaths(t *testing.T) {
	for _, n := range []int{5, 200} {
		pool := newDB(t)
		p := newLedgerProcessor(t, pool)
		batch := make([]inbox.Message, n)
		want := map[string]inbox.Message{}
		for i := range batch {
			batch[i] = intent(fmt.Sprintf("m%d", i), int64(1+i%accounts), 3)
			want[batch[i].ID] = batch[i]
		}
		batch[n/2] = intent("ghost", 99999, 7)
		delete(want, fmt.Sprintf("m%d", n/2))
		out, err := p.Process(context.Background(), batch)
		if err != nil || out[n/2].Status != inbox.StatusRejected {
			t.Fatalf("batch of %d: %v, ghost %+v", n, err, out[n/2])
		}
		assertClean(t, pool, want)
	}
}
