package pginbox_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/pginbox"
	"github.com/jetinbox/jetinbox/internal/effects"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// BenchmarkPostgresCPU measures what PostgreSQL spends per message on the
// consumer's batch path, without NATS: batches of 6,000 first deliveries
// (IDs "c-<n>", as jetinbox bench publishes them) through the processor on
// a server of its own with fsync and full-page writes on, as jetinbox bench
// runs it. "inbox" applies no effect (the claim and the commit alone),
// "ledger" the demo ledger. Every PGCPU_CHECKPOINT_EVERY batches (default
// 0: never) the run forces a checkpoint, so that the full-page images a
// long-running server writes after each one are counted too. It reports
// the CPU of all the server's processes and the WAL written, per message.
// Run with a fixed count of batches, e.g. -benchtime 30x. Environment:
// PGCPU_VARIANTS names the variants to run (see pgcpuVariantSQL; a suffix
// "@locale" runs one in a database of that default collation),
// PGCPU_ROUNDS how often to alternate them, PGCPU_SETTINGS adds server
// settings ("autovacuum=off" steadies the figures), PGCPU_STATEMENTS=1
// logs pg_stat_statements' top statements (it must be preloaded through
// PGCPU_SETTINGS), PGCPU_WALDUMP=dir writes each run's WAL range and
// relation file numbers there for pg_waldump while PGCPU_WAIT keeps the
// server up, and PGCPU_FAST=1 turns fsync and full-page writes off, as
// the shared test server has them.
func BenchmarkPostgresCPU(b *testing.B) {
	ctx := context.Background()
	// Run once (-benchtime 1x, as make test's smoke run does), it only
	// checks that it works: on the shared test server, the ledger alone,
	// one batch of warm-up.
	smoke := false
	if f := flag.Lookup("test.benchtime"); f != nil && f.Value.String() == "1x" {
		smoke = true
	}
	var srv *testenv.Postgres
	if smoke {
		srv = testenv.SharedPostgres(b)
	} else {
		opts := testenv.PostgresOptions{Durable: os.Getenv("PGCPU_FAST") == "", Settings: strings.Fields(os.Getenv("PGCPU_SETTINGS"))}
		var err error
		srv, err = testenv.StartPostgres(ctx, opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = srv.Close() })
	}
	every, _ := strconv.Atoi(os.Getenv("PGCPU_CHECKPOINT_EVERY"))
	rounds, _ := strconv.Atoi(os.Getenv("PGCPU_ROUNDS"))
	rounds = max(rounds, 1)
	variants := strings.Fields(os.Getenv("PGCPU_VARIANTS"))
	switch {
	case len(variants) > 0:
	case smoke:
		variants = []string{"ledger"}
	default:
		variants = []string{"inbox", "ledger"}
	}
	// PGCPU_IDS=random: IDs of 16 random hex digits instead of "c-<n>",
	// so that every claim lands on a leaf of its own in the key.
	randomIDs := os.Getenv("PGCPU_IDS") == "random"
	warm := 4
	if smoke {
		warm = 1
	}
	const size = 6000
	dbn := 0
	for r := range rounds {
		for _, v := range variants {
			b.Run(fmt.Sprintf("%s/round=%d", v, r), func(b *testing.B) {
				dbn++
				name := fmt.Sprintf("cpu_%d_%d", os.Getpid(), dbn)
				if base, loc, ok := strings.Cut(v, "@"); ok {
					// variant@locale: a database whose default collation is locale.
					v = base
					c, err := pgx.Connect(ctx, srv.URL("postgres"))
					if err != nil {
						b.Fatal(err)
					}
					_, err = c.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE template0 LC_COLLATE '%s' LC_CTYPE '%s'", name, loc, loc))
					c.Close(ctx)
					if err != nil {
						b.Fatal(err)
					}
				} else if _, err := srv.CreateDatabase(ctx, name); err != nil {
					b.Fatal(err)
				}
				url := srv.URL(name)
				pool := newDBAt(b, url)
				if sql := pgcpuVariantSQL[v]; sql != "" {
					if _, err := pool.Exec(ctx, sql); err != nil {
						b.Fatal(err)
					}
				}
				var h inbox.Handler[pgx.Tx] = effects.NewLedger()
				if strings.HasPrefix(v, "inbox") {
					h = inbox.HandlerFunc(func(context.Context, pgx.Tx, inbox.Message) error { return nil })
				}
				p, err := inbox.NewProcessor(pginbox.New(pool), h, inbox.Config{Scope: "ledger"})
				if err != nil {
					b.Fatal(err)
				}
				msgs := make([]inbox.Message, size)
				seq := 0
				rng := rand.New(rand.NewPCG(uint64(dbn), 7))
				batch := func() {
					for i := range msgs {
						seq++
						id := "c-" + strconv.Itoa(seq)
						if randomIDs {
							id = fmt.Sprintf("%016x", rng.Uint64())
						}
						msgs[i] = inbox.Message{ID: id, Deliveries: 1, Subject: "intents.1",
							Payload: effects.Intent{Account: int64(1 + seq%1024), Amount: 5}.AppendJSON(nil), StreamSeq: uint64(seq)}
					}
					out, err := p.Process(ctx, msgs)
					if err != nil || out[0].Status != inbox.StatusApplied {
						b.Fatal(fmt.Sprint(err, out[0]))
					}
				}
				// A warm start: 24,000 rows in, so the key has some depth.
				for range warm {
					batch()
				}
				if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
					b.Fatal(err)
				}
				if os.Getenv("PGCPU_STATEMENTS") != "" {
					if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()"); err != nil {
						b.Fatal(err)
					}
				}
				lsn0 := walLSN(ctx, b, pool)
				cpu0, sys0 := serverCPU(ctx, pool)
				b.ResetTimer()
				n := 0
				for b.Loop() {
					batch()
					n++
					if every > 0 && n%every == 0 {
						if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				cpu1, sys1 := serverCPU(ctx, pool)
				lsn1 := walLSN(ctx, b, pool)
				msgsDone := float64(b.N * size)
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/msgsDone, "pg-cpu-µs/msg")
				b.ReportMetric(float64((sys1-sys0).Microseconds())/msgsDone, "pg-sys-µs/msg")
				var wal float64
				if err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)", lsn1, lsn0).Scan(&wal); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(wal/msgsDone, "wal-B/msg")
				b.ReportMetric(msgsDone/b.Elapsed().Seconds(), "msgs/s")
				if os.Getenv("PGCPU_STATEMENTS") != "" {
					rows, err := pool.Query(ctx, `SELECT calls, round(total_exec_time::numeric, 1), round((total_exec_time*1000/$1)::numeric, 3), wal_bytes, wal_fpi, left(regexp_replace(query, '\s+', ' ', 'g'), 90) FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 8`, msgsDone)
					if err != nil {
						b.Fatal(err)
					}
					for rows.Next() {
						var calls, walB, fpi int64
						var ms, us float64
						var q string
						if err := rows.Scan(&calls, &ms, &us, &walB, &fpi, &q); err != nil {
							b.Fatal(err)
						}
						b.Logf("%6d calls %9.1f ms %6.3f µs/msg wal %9d fpi %6d  %s", calls, ms, us, walB, fpi, q)
					}
					rows.Close()
					var claimUS float64
					if err := pool.QueryRow(ctx, `SELECT coalesce(sum(total_exec_time), 0)*1000/$1 FROM pg_stat_statements WHERE query LIKE 'COPY inbox%'`, msgsDone).Scan(&claimUS); err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(claimUS, "claim-µs/msg")
				}
				if os.Getenv("PGCPU_WALDUMP") != "" {
					var dir string
					if err := pool.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
						b.Fatal(err)
					}
					if _, err := pool.Exec(ctx, "SELECT pg_switch_wal()"); err != nil {
						b.Fatal(err)
					}
					b.Logf("waldump: pg_waldump -p %s/pg_wal -s %s -e %s", dir, lsn0, lsn1)
					f := fmt.Sprintf("%s/%s.range", os.Getenv("PGCPU_WALDUMP"), strings.ReplaceAll(b.Name(), "/", "_"))
					_ = os.WriteFile(f, []byte(dir+"/pg_wal "+lsn0+" "+lsn1+"\n"), 0o644)
					var rels string
					_ = pool.QueryRow(ctx, `SELECT string_agg(relname || '=' || pg_relation_filenode(oid), ' ') FROM pg_class WHERE relname IN ('inbox','inbox_pkey','inbox_received_at_brin','ledger_entries','ledger_entries_scope_message_id','accounts','accounts_pkey')`).Scan(&rels)
					_ = os.WriteFile(f+".rels", []byte(rels+"\n"), 0o644)
					// keep the server (and its WAL) until the dump is taken
					if w := os.Getenv("PGCPU_WAIT"); w != "" {
						d, _ := time.ParseDuration(w)
						time.Sleep(d)
					}
				}
			})
		}
	}
}

// pgcpuVariantSQL are schema changes a BenchmarkPostgresCPU variant makes
// after migrating.
var pgcpuVariantSQL = map[string]string{
	// The key as it was before migration 0004: (scope, message_id) in the
	// database's default collation.
	"inbox-oldkey":  oldKeySQL,
	"ledger-oldkey": oldKeySQL,
	// The new key's order in the database's default collation.
	"inbox-defcoll": `ALTER TABLE inbox DROP CONSTRAINT inbox_pkey, ALTER scope TYPE text COLLATE "default", ALTER message_id TYPE text COLLATE "default", ADD PRIMARY KEY (message_id, scope)`,
	// The ledger's entries indexed by (message_id, scope).
	"ledger-idx": `DROP INDEX ledger_entries_scope_message_id; CREATE INDEX ON ledger_entries (message_id, scope)`,
	// Without the BRIN index on received_at that retention reads by.
	"inbox-nobrin": `DROP INDEX inbox_received_at_brin`,
	// Without the primary key: what the key costs (not a schema to run).
	"inbox-nopk": `ALTER TABLE inbox DROP CONSTRAINT inbox_pkey`,
}

const oldKeySQL = `ALTER TABLE inbox DROP CONSTRAINT inbox_pkey, ALTER scope TYPE text COLLATE "default", ALTER message_id TYPE text COLLATE "default", ADD PRIMARY KEY (scope, message_id)`

func walLSN(ctx context.Context, b *testing.B, pool *pgxpool.Pool) string {
	var lsn string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	return lsn
}

// serverCPU is the CPU time the server's processes have used so far.
func serverCPU(ctx context.Context, pool *pgxpool.Pool) (total, sys time.Duration) {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity`)
	if err != nil {
		return -1, -1
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return -1, -1
	}
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(u+st) * time.Second / 100
		sys += time.Duration(st) * time.Second / 100
	}
	return total, sys
}
