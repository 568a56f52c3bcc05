package pginbox_test

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/driver"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// BenchmarkClaimTx measures the claim path alone: one transaction per batch,
// fresh IDs, commit. Reports rows/s.
func BenchmarkClaimTx(b *testing.B) {
	for _, size := range []int{1, 100, 1000} {
		b.Run("batch="+strconv.Itoa(size), func(b *testing.B) {
			pool := newDB(b)
			ctx := context.Background()
			claims := make([]driver.Claim, size)
			fp := inbox.Fingerprint([]byte(`{"account":1,"amount":1}`))
			seq := 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for i := range claims {
					seq++
					claims[i] = driver.Claim{ID: "c-" + strconv.Itoa(seq), Fingerprint: fp, StreamSeq: uint64(seq), Subject: "intents.1"}
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := pginbox.ClaimTx(ctx, tx, "bench", claims); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkProcessLedger measures the whole batch path: claim, ledger
// effect (entry + balance), commit. Reports msgs/s. First deliveries of
// 64 messages or more are claimed with COPY; "redelivered" batches (every
// message delivered before) take the conflict-checking ClaimTx path.
func BenchmarkProcessLedger(b *testing.B) {
	for _, c := range []struct {
		size       int
		deliveries uint64
	}{{1, 1}, {100, 1}, {1000, 1}, {1000, 2}, {6000, 1}, {6000, 2}} {
		name := fmt.Sprintf("batch=%d", c.size)
		if c.deliveries > 1 {
			name += "/redelivered"
		}
		b.Run(name, func(b *testing.B) {
			pool := newDB(b)
			ctx := context.Background()
			p, err := inbox.NewProcessor(pginbox.New(pool), effects.NewLedger(), inbox.Config{Scope: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			msgs := make([]inbox.Message, c.size)
			seq := 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for i := range msgs {
					seq++
					msgs[i] = inbox.Message{ID: "m-" + strconv.Itoa(seq), Deliveries: c.deliveries,
						Payload: effects.Intent{Account: int64(1 + seq%1024), Amount: 5}.AppendJSON(nil), StreamSeq: uint64(seq)}
				}
				out, err := p.Process(ctx, msgs)
				if err != nil || out[0].Status != inbox.StatusApplied {
					b.Fatal(fmt.Sprint(err, out[0]))
				}
			}
			b.ReportMetric(float64(b.N*c.size)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkProcessLedgerExecModes is BenchmarkProcessLedger's batch path
// in each of pgx's statement modes, on a direct connection and through a
// pgbouncer in transaction pooling mode (where only the modes without named
// prepared statements work): the measurement behind the mode the consumer
// takes behind a pooler.
func BenchmarkProcessLedgerExecModes(b *testing.B) {
	ctx := context.Background()
	direct := testenv.NewDatabase(b)
	newDBAt(b, direct) // migrated, accounts seeded
	u, err := url.Parse(direct)
	if err != nil {
		b.Fatal(err)
	}
	bouncer := testenv.NewPgBouncer(b, testenv.PgBouncerOptions{PoolSize: 4})
	pooled := bouncer.URL(strings.TrimPrefix(u.Path, "/"))
	seq := 0
	for _, path := range []struct{ name, url string }{{"direct", direct}, {"pgbouncer", pooled}} {
		for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec"} {
			if path.name == "pgbouncer" && mode == "cache_statement" {
				continue // named prepared statements do not survive transaction pooling
			}
			for _, size := range []int{1, 100, 6000} {
				b.Run(fmt.Sprintf("%s/%s/batch=%d", path.name, mode, size), func(b *testing.B) {
					pool, err := pgxpool.New(ctx, testenv.WithQueryExecMode(path.url, mode))
					if err != nil {
						b.Fatal(err)
					}
					defer pool.Close()
					p, err := inbox.NewProcessor(pginbox.New(pool), effects.NewLedger(), inbox.Config{Scope: "bench"})
					if err != nil {
						b.Fatal(err)
					}
					msgs := make([]inbox.Message, size)
					b.ReportAllocs()
					b.ResetTimer()
					for b.Loop() {
						for i := range msgs {
							seq++
							msgs[i] = inbox.Message{ID: "m-" + strconv.Itoa(seq), Deliveries: 1,
								Payload: effects.Intent{Account: int64(1 + seq%1024), Amount: 5}.AppendJSON(nil), StreamSeq: uint64(seq)}
						}
						out, err := p.Process(ctx, msgs)
						if err != nil || out[0].Status != inbox.StatusApplied {
							b.Fatal(fmt.Sprint(err, out[0]))
						}
					}
					b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
				})
			}
		}
	}
}

// readOnlyDuplicates is the store without ReadPriorCommits: a batch of
// duplicates commits read-only, without waiting for anything, as before
// duplicates were made to rest on a durable commit.
type readOnlyDuplicates struct{ driver.Store[pgx.Tx] }

// BenchmarkDuplicateBatch measures a batch whose every message is a
// duplicate (the redelivery path), on a server of its own with fsync on
// (synchronous_commit=on flushes locally): "durable" is the shipped
// store, whose commit writes WAL and flushes it so that the acks rest on
// durable rows; "read-only" is the old behaviour, a commit that waits for
// nothing. Reports msgs/s.
func BenchmarkDuplicateBatch(b *testing.B) {
	ctx := context.Background()
	srv, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Durable: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Close() })
	for _, size := range []int{1, 50, 1000} {
		for _, mode := range []string{"durable", "read-only"} {
			b.Run(fmt.Sprintf("batch=%d/%s", size, mode), func(b *testing.B) {
				url, err := srv.CreateDatabase(ctx, fmt.Sprintf("dup_%d_%s", size, strings.ReplaceAll(mode, "-", "_")))
				if err != nil {
					b.Fatal(err)
				}
				pool := newDBAt(b, url)
				var st driver.Store[pgx.Tx] = pginbox.New(pool)
				if mode == "read-only" {
					st = readOnlyDuplicates{st}
				}
				p, err := inbox.NewProcessor(st, effects.NewLedger(), inbox.Config{Scope: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				msgs := make([]inbox.Message, size)
				for i := range msgs {
					msgs[i] = inbox.Message{ID: "d-" + strconv.Itoa(i), Deliveries: 2,
						Payload: effects.Intent{Account: int64(1 + i%1024), Amount: 5}.AppendJSON(nil), StreamSeq: uint64(i + 1)}
				}
				if _, err := p.Process(ctx, msgs); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					out, err := p.Process(ctx, msgs)
					if err != nil || out[0].Status != inbox.StatusDuplicate {
						b.Fatal(fmt.Sprint(err, out[0]))
					}
				}
				b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}
