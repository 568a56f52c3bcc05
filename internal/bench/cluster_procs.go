package bench

import (
	"context"
	"fmt"
	"github.com/jetinbox/jetinbox/internal/cli"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/internal/procstat"
	"github.com/jetinbox/jetinbox/internal/testenv"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

// processConsumers runs k `jetinbox consumer` processes (this binary) on
// one fresh durable and database, until every message is applied, and
// returns the rate and the CPU the processes used per message (user and
// system, from /proc; the nats-servers and PostgreSQL not included).
func processConsumers(ctx context.Context, js jetstream.JetStream, urls, stream string, pg *testenv.Postgres, o ClusterOptions, k int, want int64) (ConsumerRate, error) {
	exe, err := os.Executable()
	if err != nil {
		return ConsumerRate{}, fmt.Errorf("bench: %w", err)
	}
	name := fmt.Sprintf("procs_%d", k)
	pool, err := benchDB(ctx, pg, name, o.Accounts)
	if err != nil {
		return ConsumerRate{}, err
	}
	defer pool.Close()
	cctx, cancel := context.WithTimeout(ctx, setupCeiling)
	_, err = natsenv.CreateConsumer(cctx, js, stream, jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 50_000, AckWait: time.Minute, MaxDeliver: 20, MaxWaiting: 512,
	})
	cancel()
	if err != nil {
		return ConsumerRate{}, err
	}
	wal0, werr := walLSN(ctx, pool)
	var cmds []*exec.Cmd
	var logs []*strings.Builder
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	start := time.Now()
	for range k {
		cmd := exec.CommandContext(ctx, exe, "consumer", "-http", "", "-durable", name, "-batch", strconv.Itoa(o.Batch),
			"-inflight", strconv.Itoa(o.InFlight), "-max-ack-pending", "50000", "-log-format", "json")
		cmd.Env = append(os.Environ(), "NATS_URL="+urls, "DATABASE_URL="+pg.URL(name))
		var log strings.Builder
		cmd.Stderr = &log
		if err := cmd.Start(); err != nil {
			return ConsumerRate{}, fmt.Errorf("bench: start consumer process: %w", err)
		}
		cmds, logs = append(cmds, cmd), append(logs, &log)
	}
	var cpu time.Duration
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&n); err != nil {
			return ConsumerRate{}, fmt.Errorf("bench: %w", err)
		}
		if n >= o.N {
			break
		}
		if time.Since(start) > 10*time.Minute {
			return ConsumerRate{}, fmt.Errorf("bench: %d consumer processes applied %d of %d in 10 minutes:\n%s", k, n, o.N, logs[0].String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	el := time.Since(start)
	for _, c := range cmds {
		cpu += procstat.CPU(c.Process.Pid)
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	if err := checkLedger(ctx, &cli.Store{PG: pool}, o.N, want); err != nil {
		return ConsumerRate{}, err
	}
	r := ConsumerRate{Approach: "jetinbox (processes)", Consumers: k, Rate: float64(o.N) / el.Seconds(), CPUPerMsg: cpu / time.Duration(o.N)}
	var walBytes, xacts float64
	if wal1, err := walLSN(ctx, pool); werr == nil && err == nil {
		_ = pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)`, wal1, wal0).Scan(&walBytes)
	}
	_ = pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text)::float8 FROM ledger_entries`).Scan(&xacts)
	r.WALPerMsg = walBytes / float64(o.N)
	if xacts > 0 {
		r.BatchesPer = float64(o.N) / xacts
	}
	pool.Close()
	if err := pg.DropDatabase(ctx, name); err != nil {
		return ConsumerRate{}, err
	}
	if err := js.DeleteConsumer(ctx, stream, name); err != nil {
		return ConsumerRate{}, fmt.Errorf("bench: %w", err)
	}
	return r, nil
}
