package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/internal/testenv/natsenv"
)

type shardDefs struct {
	m                       *shard.Map
	stream, dlq, advisories jetstream.StreamConfig
	partition, rescue       jetstream.ConsumerConfig
	ledger, ledgerRescue    jetstream.ConsumerConfig
}

func loadShardDefs(fsys files) (*shardDefs, error) {
	var d shardDefs
	for name, v := range map[string]any{
		"sharding/pintents-stream.json":                  &d.stream,
		"sharding/pintents-dlq-stream.json":              &d.dlq,
		"sharding/pintents-advisories-stream.json":       &d.advisories,
		"sharding/ledger-partition-consumer.json":        &d.partition,
		"sharding/ledger-partition-rescue-consumer.json": &d.rescue,
		"jetstream/ledger-consumer.json":                 &d.ledger,
		"jetstream/ledger-rescue-consumer.json":          &d.ledgerRescue,
	} {
		b, err := fsys.get(name)
		if err != nil {
			return nil, err
		}
		if err := decodeStrict(b, v); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	b, err := fsys.get("sharding/shards.json")
	if err != nil {
		return nil, err
	}
	// shard.Load reads a path: the (possibly mutated) bytes go through a
	// temporary file.
	f, err := os.CreateTemp("", "shards-*.json")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		return nil, err
	}
	f.Close()
	if d.m, err = shard.Load(f.Name()); err != nil {
		return nil, err
	}
	return &d, nil
}

// validateShards checks the sharded stream's files against each other and
// against the shard map: the transform is the one the consumers check, the
// dead-letter and advisory streams are what jsinbox would make for it, and
// the partition durable is the ledger durable with the partition's filter.
func validateShards(fsys files) error {
	d, err := loadShardDefs(fsys)
	if err != nil {
		return err
	}
	m := d.m
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	errs = append(errs, checkStream("sharding/pintents-stream.json", withoutTransform(d.stream), m.Stream, m.Subject+".*.>"))
	if err := m.CheckStream(d.stream); err != nil {
		errs = append(errs, fmt.Errorf("sharding/pintents-stream.json: %w", err))
	}
	check(d.stream.MaxConsumers < 0 || d.stream.MaxConsumers >= m.Partitions, "sharding/pintents-stream.json: max_consumers %d cannot hold a durable per partition (%d)", d.stream.MaxConsumers, m.Partitions)
	check(d.advisories.MaxConsumers < 0 || d.advisories.MaxConsumers >= m.Partitions, "sharding/pintents-advisories-stream.json: max_consumers %d cannot hold a rescue durable per partition (%d)", d.advisories.MaxConsumers, m.Partitions)
	o := jsinbox.StreamConfig{Name: d.stream.Name, Subjects: d.stream.Subjects, Replicas: d.stream.Replicas, MaxAge: d.stream.MaxAge}
	wantDLQ := o.DeadLetterConfig()
	errs = append(errs, checkStream("sharding/pintents-dlq-stream.json", d.dlq, wantDLQ.Name, wantDLQ.Subjects[0]))
	wantAdv := o.AdvisoryConfig()
	check(d.advisories.Name == wantAdv.Name && slices.Equal(d.advisories.Subjects, wantAdv.Subjects), "sharding/pintents-advisories-stream.json: %s %v, want %s %v", d.advisories.Name, d.advisories.Subjects, wantAdv.Name, wantAdv.Subjects)
	check(d.advisories.MaxAge == wantAdv.MaxAge && d.advisories.DenyDelete && d.advisories.DenyPurge && d.advisories.Storage == jetstream.FileStorage,
		"sharding/pintents-advisories-stream.json: must outlive the stream (max_age %v), deny delete and purge, on file", wantAdv.MaxAge)
	p := d.partition
	check(p.Durable == m.Durable(0) && p.Name == m.Durable(0), "sharding/ledger-partition-consumer.json: durable %q, want partition 0's %q", p.Durable, m.Durable(0))
	check(p.FilterSubject == m.Filter(0) && len(p.FilterSubjects) == 0, "sharding/ledger-partition-consumer.json: filter %q, want %q (partition 0 of the stored subjects)", p.FilterSubject, m.Filter(0))
	l := d.ledger
	check(p.AckPolicy == l.AckPolicy && p.AckWait == l.AckWait && p.MaxDeliver == l.MaxDeliver && p.MaxAckPending == l.MaxAckPending && p.MaxWaiting == l.MaxWaiting &&
		p.DeliverPolicy == l.DeliverPolicy && p.Replicas == l.Replicas && p.InactiveThreshold == 0 && len(p.BackOff) == 0 && p.DeliverSubject == "" && !p.MemoryStorage,
		"sharding/ledger-partition-consumer.json: settings differ from ledger-consumer.json's (a partition durable is the ledger durable on one partition)")
	r := d.rescue
	check(r.Durable == p.Durable && r.FilterSubject == maxDeliveriesSubject(m.Stream, p.Durable), "sharding/ledger-partition-rescue-consumer.json: durable %q filter %q, want %q on its own advisories", r.Durable, r.FilterSubject, p.Durable)
	lr := d.ledgerRescue
	check(r.MaxDeliver == lr.MaxDeliver && r.AckWait == lr.AckWait && r.AckPolicy == lr.AckPolicy && r.DeliverPolicy == lr.DeliverPolicy && r.MaxAckPending == lr.MaxAckPending && r.InactiveThreshold == 0,
		"sharding/ledger-partition-rescue-consumer.json: settings differ from ledger-rescue-consumer.json's")
	return errors.Join(errs...)
}

// withoutTransform lets checkStream judge the sharded stream's limits.
func withoutTransform(c jetstream.StreamConfig) jetstream.StreamConfig {
	c.SubjectTransform = nil
	return c
}

func TestShardedStreamFiles(t *testing.T) {
	if err := validateShards(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}

// TestShardedStreamMutations: the checks reject a transform that is not
// the map's, a partition count the map does not have, and a durable that
// filters another partition.
func TestShardedStreamMutations(t *testing.T) {
	fsys := loadFiles(t)
	for _, c := range []struct{ name, file, old, nu string }{
		{"partition of the whole subject", "sharding/pintents-stream.json", "{{partition(64,1)}}", "{{partition(64,1,2)}}"},
		{"partition count", "sharding/pintents-stream.json", "partition(64,1)", "partition(32,1)"},
		{"map partition count", "sharding/shards.json", `"partitions": 64`, `"partitions": 65`},
		{"durable of another partition", "sharding/ledger-partition-consumer.json", `"filter_subject": "pintents.0.>"`, `"filter_subject": "pintents.1.>"`},
		{"too few consumers", "sharding/pintents-stream.json", `"max_consumers": 80`, `"max_consumers": 8`},
	} {
		if err := validateShards(fsys.with(t, c.file, c.old, c.nu)); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}

// TestShardedStreamOnAServer creates the shipped stream on a real
// nats-server (one replica) and publishes through its transform: every
// stored subject is the one the consumers' binding check expects.
func TestShardedStreamOnAServer(t *testing.T) {
	d, err := loadShardDefs(loadFiles(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := natsenv.NewNATS(t, natsenv.NATSOptions{StoreDir: filepath.Join(t.TempDir(), "js")})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := d.stream
	cfg.Replicas = 1
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		id := fmt.Sprintf("order-%d", i)
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: shard.PublishSubject(d.m.Subject, id, "ledger.3"), Data: []byte("{}"), Header: nats.Header{jetstream.MsgIDHeader: {id}}})
		if err != nil {
			t.Fatal(err)
		}
		s, _ := js.Stream(ctx, cfg.Name)
		raw, err := s.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := shard.Check(d.m.Subject, d.m.Partitions, id, raw.Subject); err != nil {
			t.Fatalf("the shipped transform stored %s as %s: %v", id, raw.Subject, err)
		}
	}
}

// TestShardDatabaseRoles runs a shard's database as deploy/postgres sets
// one up (roles.sql, the migrations with the partition table, grants.sql,
// shard-grants.sql): the consumer can read and fence its partitions but
// not take or give one away; the verifier only reads; the migrator moves.
func TestShardDatabaseRoles(t *testing.T) {
	t.Parallel()
	fx := fixture(t)
	pg := startPostgres(t, fx)
	pg.superuser(t, "postgres", "CREATE DATABASE jetinbox")
	pg.superuserFile(t, "jetinbox", "postgres/roles.sql")
	pg.superuser(t, "jetinbox", "ALTER ROLE jetinbox_migrator PASSWORD 'migrator-pw'; ALTER ROLE jetinbox_consumer PASSWORD 'consumer-pw'; ALTER ROLE jetinbox_verifier PASSWORD 'verifier-pw'")
	migrator := pg.as("jetinbox_migrator", "migrator-pw")
	consumer := pg.as("jetinbox_consumer", "consumer-pw")
	verifier := pg.as("jetinbox_verifier", "verifier-pw")
	migrator.must(t, `CREATE TABLE IF NOT EXISTS jetinbox_migrations (component text NOT NULL, version integer NOT NULL, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (component, version))`)
	var migrations []string
	for _, dir := range []string{"../inbox/pginbox/migrations", "../internal/effects/migrations", "../outbox/pgoutbox/migrations", "../internal/shard/migrations"} {
		m, _ := filepath.Glob(filepath.Join(dir, "*.sql"))
		if len(m) == 0 {
			t.Fatalf("no migrations in %s", dir)
		}
		migrations = append(migrations, m...)
	}
	for _, m := range migrations {
		migrator.mustFile(t, m)
	}
	migrator.mustFile(t, "postgres/grants.sql")
	migrator.mustFile(t, "postgres/shard-grants.sql")
	migrator.mustFile(t, "postgres/shard-grants.sql") // idempotent
	// What migrate -shards records, and a move's statements.
	migrator.must(t, `INSERT INTO jetinbox_partitions (scope, partition, owned) SELECT 'ledger', p, true FROM unnest(ARRAY[0, 1, 2]) AS p ON CONFLICT DO NOTHING`)
	migrator.must(t, `BEGIN; SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = '30s'; UPDATE jetinbox_partitions SET owned = false, moved_to = 'c', changed_at = now() WHERE scope = 'ledger' AND partition = 2 AND owned; SELECT pg_logical_emit_message(true, 'jetinbox.durable', ''); COMMIT`)
	migrator.must(t, `BEGIN; SELECT owned, moved_to FROM jetinbox_partitions WHERE scope = 'ledger' AND partition = 2 FOR SHARE; SELECT message_id FROM inbox WHERE scope = 'ledger' AND message_id > '' AND jetinbox_partition_of(message_id, 64) = 2; COMMIT`)
	migrator.must(t, `BEGIN; SELECT owned, moved_to FROM jetinbox_partitions WHERE scope = 'ledger' AND partition = 2 FOR UPDATE; UPDATE jetinbox_partitions SET owned = true, moved_to = NULL WHERE scope = 'ledger' AND partition = 2; COMMIT`)
	migrator.must(t, `INSERT INTO inbox (scope, message_id, fingerprint, status, reason, stream_seq, subject, received_at) SELECT 'ledger', * FROM unnest(ARRAY['m'], ARRAY['\x01'::bytea], ARRAY['applied'], ARRAY[NULL::text], ARRAY[1::bigint], ARRAY['pintents.2.k.ledger.1'], ARRAY[now()]) ON CONFLICT DO NOTHING`)
	// The consumer's statements: the runner's poll and each batch's fence.
	consumer.must(t, `SELECT partition FROM jetinbox_partitions WHERE scope = 'ledger' AND owned ORDER BY partition`)
	consumer.must(t, `BEGIN; SELECT partition FROM jetinbox_partitions WHERE scope = 'ledger' AND partition = ANY(ARRAY[0, 1]::int[]) AND owned FOR SHARE; COMMIT`)
	denied := []string{"permission denied"}
	for _, q := range []string{
		`UPDATE jetinbox_partitions SET owned = true`,
		`INSERT INTO jetinbox_partitions (scope, partition, owned) VALUES ('ledger', 9, true)`,
		`DELETE FROM jetinbox_partitions`,
		`SELECT moved_to FROM jetinbox_partitions`,
		`SELECT jetinbox_partition_of('x', 64)`,
		`INSERT INTO inbox (scope, message_id, fingerprint, received_at) VALUES ('ledger', 'x', '\x01', now() - interval '1 year')`,
	} {
		consumer.mustFail(t, q, denied...)
	}
	verifier.must(t, `SELECT partition, owned FROM jetinbox_partitions`)
	verifier.mustFail(t, `BEGIN; SELECT partition FROM jetinbox_partitions FOR SHARE; COMMIT`, "permission denied", "read-only transaction")
	verifier.mustFail(t, `UPDATE jetinbox_partitions SET owned = false`, "permission denied", "read-only transaction")
}
