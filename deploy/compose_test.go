package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	composetypes "github.com/compose-spec/compose-go/v2/types"
)

func loadCompose(fsys files) (*composetypes.Project, error) {
	b, err := fsys.get("compose.yaml")
	if err != nil {
		return nil, err
	}
	wd, err := filepath.Abs(".")
	if err != nil {
		return nil, err
	}
	details := composetypes.ConfigDetails{
		WorkingDir:  wd,
		ConfigFiles: []composetypes.ConfigFile{{Filename: filepath.Join(wd, "compose.yaml"), Content: b}},
		Environment: composetypes.Mapping{},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return loader.LoadWithContext(ctx, details, func(o *loader.Options) {
		o.SetProjectName("jetinbox", true)
		o.Profiles = []string{"*"}
		o.ResolvePaths = true
	})
}

func validateCompose(fsys files, fx *secretsFixture) error {
	p, err := loadCompose(fsys)
	if err != nil {
		return err
	}
	js, err := loadJetStream(fsys)
	if err != nil {
		return err
	}
	wd, _ := filepath.Abs(".")
	secretsDir := filepath.Join(wd, "secrets")
	generated := map[string]bool{}
	for _, f := range fx.files {
		generated[filepath.Join(secretsDir, filepath.FromSlash(f))] = true
		for d := filepath.Dir(f); d != "."; d = filepath.Dir(d) {
			generated[filepath.Join(secretsDir, d)] = true
		}
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("compose.yaml: "+format, args...))
		}
	}
	// A path in the stack either exists in the repository or is one that
	// `go run ./cmd/devsecrets` writes.
	checkPath := func(what, p string) {
		if strings.HasPrefix(p, secretsDir+string(filepath.Separator)) {
			check(generated[p], "%s %s is not written by cmd/devsecrets", what, p)
			return
		}
		rel, err := filepath.Rel(wd, p)
		if err == nil && !strings.HasPrefix(rel, "..") {
			_, ok := fsys[filepath.ToSlash(rel)]
			if !ok {
				// A directory of the deploy tree.
				for name := range fsys {
					if strings.HasPrefix(name, filepath.ToSlash(rel)+"/") {
						ok = true
						break
					}
				}
			}
			check(ok, "%s %s does not exist", what, p)
			return
		}
		_, err = os.Stat(p)
		check(err == nil, "%s %s does not exist", what, p)
	}

	want := []string{"accounts", "consumer", "db-grants", "deliver", "deliver-db-setup", "intake", "intake-db-setup", "intake-migrate", "intake-postgres", "intake-prune", "intake-relay", "migrate", "nats-1", "nats-2", "nats-3", "nats-setup", "postgres", "producer", "prometheus", "relay", "secrets-init", "verify"}
	got := slices.Sorted(maps.Keys(p.Services))
	check(slices.Equal(got, want), "services %v, want %v", got, want)

	// The ledger credits only accounts that exist: they are opened after
	// the migration and before the consumer starts.
	if acc, ok := p.Services["accounts"]; !ok {
		check(false, "no accounts service")
	} else {
		check(len(acc.Command) > 1 && acc.Command[0] == "accounts" && acc.Command[1] == "-open", "accounts service runs %v, want `jetinbox accounts -open …`", acc.Command)
		_, afterMigrate := acc.DependsOn["migrate"]
		check(afterMigrate, "accounts must wait for migrate")
		_, beforeConsumer := p.Services["consumer"].DependsOn["accounts"]
		check(beforeConsumer, "the consumer must wait for the accounts")
	}

	// secrets-init copies each service's secrets, by volume: "copy DIR
	// SECRET..." into /out/DIR, where the volume is mounted.
	copies := map[string][]string{}
	if si, ok := p.Services["secrets-init"]; ok {
		attached := map[string]bool{}
		for _, sec := range si.Secrets {
			attached[sec.Source] = true
		}
		volumeAt := map[string]string{}
		for _, v := range si.Volumes {
			volumeAt[v.Target] = v.Source
		}
		check(si.User == "0:0", "secrets-init must run as root to read the 0600 secret files")
		script := strings.Join(si.Command, "\n")
		for _, m := range regexp.MustCompile(`(?m)^\s*copy (\S+) (.+)$`).FindAllStringSubmatch(script, -1) {
			vol := volumeAt["/out/"+m[1]]
			check(vol != "", "secrets-init copies into /out/%s, where no volume is mounted", m[1])
			for _, f := range strings.Fields(m[2]) {
				check(attached[f], "secrets-init copies %s, which is not attached to it", f)
				copies[vol] = append(copies[vol], f)
			}
		}
		check(len(copies) > 0, "secrets-init copies nothing")
	}
	for name, s := range p.Services {
		for _, v := range s.Volumes {
			if v.Type == composetypes.VolumeTypeBind {
				checkPath("service "+name+" bind mount", v.Source)
			}
		}
		if s.Build != nil {
			checkPath("service "+name+" build context", s.Build.Context)
			checkPath("service "+name+" dockerfile", filepath.Join(s.Build.Context, s.Build.Dockerfile))
		}
		attached := map[string]bool{}
		for _, sec := range s.Secrets {
			_, ok := p.Secrets[sec.Source]
			check(ok, "service %s uses undefined secret %s", name, sec.Source)
			attached["/run/secrets/"+sec.Source] = true
		}
		// Every environment value naming a secret file names an attached one.
		// The secrets copied into the volume mounted at /run/jetinbox.
		copied := map[string]bool{}
		for _, v := range s.Volumes {
			if v.Target == "/run/jetinbox" {
				check(v.Type == composetypes.VolumeTypeVolume && v.ReadOnly, "service %s: /run/jetinbox must be a read-only named volume", name)
				for _, f := range copies[v.Source] {
					copied["/run/jetinbox/"+f] = true
				}
				check(len(copies[v.Source]) > 0, "service %s: secrets-init copies nothing into volume %s", name, v.Source)
				check(s.DependsOn["secrets-init"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "service %s must wait for secrets-init to complete", name)
			}
		}
		for k, v := range s.Environment {
			if v == nil {
				check(false, "service %s: %s has no value", name, k)
				continue
			}
			for _, m := range regexp.MustCompile(`/run/secrets/[A-Za-z0-9_.-]+`).FindAllString(*v, -1) {
				check(attached[m], "service %s: %s refers to %s, which is not attached", name, k, m)
			}
			for _, m := range regexp.MustCompile(`/run/jetinbox/[A-Za-z0-9_.-]+`).FindAllString(*v, -1) {
				check(copied[m], "service %s: %s refers to %s, which secrets-init does not copy into its volume", name, k, m)
			}
		}
		// And so does every argument naming one (the intake's certificate).
		for _, m := range regexp.MustCompile(`/run/jetinbox/[A-Za-z0-9_.-]+`).FindAllString(strings.Join(s.Command, " "), -1) {
			check(copied[m], "service %s: its command refers to %s, which secrets-init does not copy into its volume", name, m)
		}
		// secrets/ is the host user's alone (0600): a container that does
		// not start as root cannot read a bind-mounted secret.
		if s.User != "" && !strings.HasPrefix(s.User, "0") {
			check(len(s.Secrets) == 0, "service %s runs as %s and cannot read the 0600 secret files %v: give it copies from secrets-init", name, s.User, s.Secrets)
			for _, v := range s.Volumes {
				check(v.Type != composetypes.VolumeTypeBind || !strings.HasPrefix(v.Source, secretsDir), "service %s runs as %s and cannot read the bind-mounted %s", name, s.User, v.Source)
			}
		}
	}
	for name, sec := range p.Secrets {
		checkPath("secret "+name, sec.File)
	}

	// NATS: three servers of one version, 2.12.3 or later, each with its own
	// config and the shared ones at the paths the configs include.
	for _, n := range natsNodes {
		s, ok := p.Services[n]
		if !ok {
			continue
		}
		check(imageAtLeast(s.Image, "nats", [3]int{2, 12, 3}), "%s image %q, want nats 2.12.3 or later", n, s.Image)
		mounts := map[string]string{}
		for _, v := range s.Volumes {
			mounts[v.Target] = v.Source
		}
		check(mounts["/etc/nats/nats.conf"] == filepath.Join(wd, "nats", n+".conf"), "%s does not mount nats/%s.conf at /etc/nats/nats.conf", n, n)
		check(mounts["/etc/nats/common.conf"] == filepath.Join(wd, "nats", "common.conf"), "%s does not mount nats/common.conf", n)
		check(mounts["/etc/nats/auth.conf"] != "", "%s does not mount an auth.conf", n)
		check(mounts["/etc/nats/tls"] != "", "%s does not mount the TLS directory at /etc/nats/tls", n)
		check(mounts["/data"] != "", "%s does not keep /data (the JetStream store) in a volume", n)
		check(slices.Equal(s.Command, composetypes.ShellCommand{"--config", "/etc/nats/nats.conf"}), "%s command %v", n, s.Command)
		check(s.StopGracePeriod != nil && time.Duration(*s.StopGracePeriod) > 30*time.Second, "%s stop_grace_period must exceed lame_duck_duration (30s)", n)
		check(s.HealthCheck != nil && !s.HealthCheck.Disable, "%s has no healthcheck", n)
	}

	if s, ok := p.Services["postgres"]; ok {
		check(strings.HasPrefix(s.Image, "postgres:15"), "postgres image %q, want postgres:15", s.Image)
		check(s.HealthCheck != nil, "postgres has no healthcheck")
	}

	if s, ok := p.Services["nats-setup"]; ok {
		script := strings.Join(s.Command, " ")
		for _, f := range []string{"advisories-stream.json", "ledger-rescue-consumer.json", "intents-stream.json", "dlq-stream.json", "ledger-consumer.json", "notifications-stream.json"} {
			check(strings.Contains(script, "/jetstream/"+f), "nats-setup does not apply jetstream/%s", f)
		}
		check(strings.Contains(script, fmt.Sprintf("nats consumer add %s %s --config /jetstream/ledger-rescue-consumer.json", js.advisories.Name, js.rescue.Durable)),
			"nats-setup does not add the rescue consumer %s on %s", js.rescue.Durable, js.advisories.Name)
		check(applyOrder(script, "/jetstream/"), "nats-setup must create the advisory stream and the rescue consumer before the intents stream")
	}

	binaries := dockerfileBinaries(fsys)
	env := func(svc, k string) string {
		s := p.Services[svc]
		if v := s.Environment[k]; v != nil {
			return *v
		}
		return ""
	}
	for _, svc := range []string{"consumer", "producer", "migrate", "relay", "verify", "intake", "intake-migrate", "intake-relay", "intake-prune", "deliver"} {
		s, ok := p.Services[svc]
		if !ok {
			continue
		}
		check(s.Build != nil, "%s is not built from deploy/Dockerfile", svc)
		check(len(s.Entrypoint) > 0 && binaries[s.Entrypoint[0]], "%s entrypoint %v is not a binary deploy/Dockerfile installs (%v)", svc, s.Entrypoint, slices.Sorted(maps.Keys(binaries)))
		check(s.ReadOnly, "%s must run with a read-only root filesystem", svc)
		check(s.User != "" && !strings.HasPrefix(s.User, "0"), "%s must run as a non-root user", svc)
	}
	for _, svc := range []string{"consumer", "producer", "relay", "verify", "intake-relay"} {
		for _, k := range []string{"NATS_URL", "NATS_NKEY", "NATS_CA", "NATS_CERT", "NATS_KEY"} {
			check(env(svc, k) != "", "%s: %s is not set", svc, k)
		}
		role := strings.TrimSuffix(filepath.Base(env(svc, "NATS_NKEY")), "_nkey")
		check(inboxPrefix[role] != "" && env(svc, "NATS_INBOX_PREFIX") == inboxPrefix[role],
			"%s: NATS_INBOX_PREFIX %q, want its NATS user's own %q: the user may subscribe to nothing else", svc, env(svc, "NATS_INBOX_PREFIX"), inboxPrefix[role])
		if svc == "relay" {
			check(env(svc, "JETINBOX_RELAY_STREAM") == js.notifications.Name, "relay: JETINBOX_RELAY_STREAM %q, the stream is %q", env(svc, "JETINBOX_RELAY_STREAM"), js.notifications.Name)
		} else if svc == "intake-relay" {
			check(env(svc, "JETINBOX_RELAY_STREAM") == js.intents.Name, "intake-relay: JETINBOX_RELAY_STREAM %q, the intake's intents go to %q", env(svc, "JETINBOX_RELAY_STREAM"), js.intents.Name)
		} else {
			check(env(svc, "JETINBOX_STREAM") == js.intents.Name, "%s: JETINBOX_STREAM %q, the stream is %q", svc, env(svc, "JETINBOX_STREAM"), js.intents.Name)
		}
		for _, u := range strings.Split(env(svc, "NATS_URL"), ",") {
			pu, err := url.Parse(u)
			check(err == nil && pu.Scheme == "tls" && slices.Contains(natsNodes, pu.Hostname()), "%s: NATS_URL entry %q is not tls:// to a cluster node", svc, u)
		}
	}
	// The scope is set explicitly: it is the effect's identity and must not
	// drift with a default or with the durable's name.
	for _, k := range []string{"DATABASE_URL", "JETINBOX_SCOPE", "JETINBOX_DURABLE", "JETINBOX_DRAIN_TIMEOUT", "JETINBOX_HTTP_ADDR"} {
		check(env("consumer", k) != "", "consumer: %s is not set", k)
	}
	// The binaries listen on loopback by default: a container that must be
	// reached says where it listens.
	check(strings.HasPrefix(env("consumer", "JETINBOX_HTTP_ADDR"), "0.0.0.0:"), "consumer: JETINBOX_HTTP_ADDR %q, want an explicit 0.0.0.0:port", env("consumer", "JETINBOX_HTTP_ADDR"))
	check(env("consumer", "JETINBOX_DURABLE") == js.ledger.Durable, "consumer: JETINBOX_DURABLE %q, the durable is %q", env("consumer", "JETINBOX_DURABLE"), js.ledger.Durable)
	for _, svc := range []string{"consumer", "migrate", "relay", "verify", "intake", "intake-migrate", "intake-relay", "intake-prune", "deliver"} {
		check(strings.Contains(env(svc, "DATABASE_URL"), "sslmode=verify-full"), "%s: DATABASE_URL must use sslmode=verify-full", svc)
	}
	checkIntakeCompose(p, env, check)
	checkDeliverCompose(fsys, p, env, check)
	check(strings.Contains(env("relay", "DATABASE_URL"), "jetinbox_relay@"), "relay must connect as jetinbox_relay, the role that may only read and mark the outbox")
	check(env("relay", "NATS_NKEY") == "/run/jetinbox/relay_nkey", "relay must connect as the relay NATS user, not %q", env("relay", "NATS_NKEY"))
	if r, ok := p.Services["relay"]; ok {
		cmd := strings.Join(r.Command, " ")
		check(strings.HasPrefix(cmd, "relay ") && strings.Contains(cmd, "-http 0.0.0.0:"), "relay command %v, want jetinbox relay serving -http on every interface of the container", r.Command)
		check(r.DependsOn["nats-setup"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "relay must wait for nats-setup (NOTIFICATIONS) to complete")
		check(r.DependsOn["db-grants"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "relay must wait for db-grants to complete")
		check(slices.Contains(p.Services["consumer"].Command, "-follow-ups"), "the consumer does not emit the notifications the relay publishes (-follow-ups): command %v", p.Services["consumer"].Command)
	}
	check(strings.Contains(env("consumer", "DATABASE_URL"), "jetinbox_consumer@"), "consumer must connect as jetinbox_consumer")
	check(strings.Contains(env("migrate", "DATABASE_URL"), "jetinbox_migrator@"), "migrate must connect as jetinbox_migrator")
	check(strings.Contains(env("verify", "DATABASE_URL"), "jetinbox_verifier@"), "verify must connect as jetinbox_verifier, the role that may only read")
	if c, ok := p.Services["consumer"]; ok {
		drain, err := time.ParseDuration(env("consumer", "JETINBOX_DRAIN_TIMEOUT"))
		check(err == nil, "consumer: JETINBOX_DRAIN_TIMEOUT: %v", err)
		check(c.StopGracePeriod != nil && time.Duration(*c.StopGracePeriod) > drain, "consumer: stop_grace_period must exceed JETINBOX_DRAIN_TIMEOUT %v", drain)
		check(c.DependsOn["nats-setup"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "consumer must wait for nats-setup to complete")
		check(c.DependsOn["db-grants"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "consumer must wait for db-grants to complete")
	}
	// The verify service judges the consumer's scope and durable, serves
	// /metrics where prometheus.yml scrapes it, and uses its own NATS user.
	if v, ok := p.Services["verify"]; ok {
		cmd := strings.Join(v.Command, " ")
		check(strings.HasPrefix(cmd, "verify -watch ") && strings.Contains(cmd, "-http 0.0.0.0:"+verifyTarget[strings.LastIndex(verifyTarget, ":")+1:]),
			"verify command %v must be verify -watch serving -http on the port prometheus.yml scrapes (%s)", v.Command, verifyTarget)
		for _, k := range []string{"JETINBOX_SCOPE", "JETINBOX_DURABLE"} {
			check(env("verify", k) == env("consumer", k), "verify: %s %q, the consumer's is %q", k, env("verify", k), env("consumer", k))
		}
		check(env("verify", "NATS_NKEY") == "/run/jetinbox/verify_nkey", "verify must connect as the verify NATS user, not %q", env("verify", "NATS_NKEY"))
		check(v.DependsOn["nats-setup"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "verify must wait for nats-setup to complete")
	}
	if m, ok := p.Services["migrate"]; ok {
		check(slices.Equal(m.Command, composetypes.ShellCommand{"migrate"}), "migrate command %v, want [migrate]", m.Command)
		check(m.DependsOn["postgres"].Condition == composetypes.ServiceConditionHealthy, "migrate must wait for a healthy postgres")
	}
	if g, ok := p.Services["db-grants"]; ok {
		check(g.DependsOn["migrate"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "db-grants must run after migrate")
	}
	if s, ok := p.Services["prometheus"]; ok {
		targets := map[string]bool{}
		for _, v := range s.Volumes {
			targets[v.Target] = true
		}
		check(targets["/etc/prometheus/prometheus.yml"] && targets["/etc/prometheus/alerts.yml"], "prometheus does not mount prometheus.yml and alerts.yml")
	}
	return errors.Join(errs...)
}

func TestCompose(t *testing.T) {
	fsys := loadFiles(t)
	if err := validateCompose(fsys, fixture(t)); err != nil {
		t.Fatal(err)
	}
}

// checkIntakeCompose: the HTTP intake runs in a database of its own (its
// own server: a relay takes every pending row of its outbox, and the
// consumer's holds notifications for another stream), migrated by the
// schema owner, under jetinbox_intake after postgres/intake.sql made it, on
// TLS with its tenants file, pruned by the maintainer; its relay publishes
// into INTENTS as jetinbox_relay with the producer's NATS user.
func checkIntakeCompose(p *composetypes.Project, env func(svc, k string) string, check func(bool, string, ...any)) {
	host := func(svc string) string {
		u, err := url.Parse(env(svc, "DATABASE_URL"))
		if err != nil {
			return ""
		}
		return u.Hostname()
	}
	user := func(svc string) string {
		u, err := url.Parse(env(svc, "DATABASE_URL"))
		if err != nil || u.User == nil {
			return ""
		}
		return u.User.Username()
	}
	for svc, role := range map[string]string{"intake": "jetinbox_intake", "intake-migrate": "jetinbox_migrator", "intake-relay": "jetinbox_relay", "intake-prune": "jetinbox_maintainer"} {
		check(user(svc) == role, "%s connects as %q, want %s", svc, user(svc), role)
		check(host(svc) == "intake-postgres", "%s connects to %q, want the intake's own server intake-postgres", svc, host(svc))
		check(env(svc, "PGPASSFILE") != "", "%s: PGPASSFILE is not set", svc)
	}
	check(host("intake") != host("consumer"), "the intake shares the consumer's database server %q: its relay would take the consumer's notifications", host("consumer"))
	if pg, ok := p.Services["intake-postgres"]; ok {
		check(strings.HasPrefix(pg.Image, "postgres:15") && pg.Image == p.Services["postgres"].Image, "intake-postgres image %q, want the postgres service's %q", pg.Image, p.Services["postgres"].Image)
		check(pg.HealthCheck != nil && !pg.HealthCheck.Disable, "intake-postgres has no healthcheck")
		mounts := map[string]string{}
		for _, v := range pg.Volumes {
			mounts[v.Target] = v.Source
		}
		for _, f := range []string{"/etc/postgresql/pg_hba.conf", "/etc/postgresql/jetinbox.conf", "/docker-entrypoint-initdb.d/10-roles.sql", "/docker-entrypoint-initdb.d/20-jetinbox.sh"} {
			check(mounts[f] != "" && mounts[f] == func() string {
				for _, v := range p.Services["postgres"].Volumes {
					if v.Target == f {
						return v.Source
					}
				}
				return ""
			}(), "intake-postgres does not mount the postgres service's %s", f)
		}
		data := mounts["/var/lib/postgresql/data"]
		for _, v := range p.Services["postgres"].Volumes {
			check(v.Target != "/var/lib/postgresql/data" || v.Source != data, "intake-postgres keeps its data in the consumer's volume %s", data)
		}
	}
	if m, ok := p.Services["intake-migrate"]; ok {
		check(slices.Equal(m.Command, composetypes.ShellCommand{"intake", "-migrate"}), "intake-migrate command %v, want [intake -migrate]", m.Command)
		check(m.DependsOn["intake-postgres"].Condition == composetypes.ServiceConditionHealthy, "intake-migrate must wait for a healthy intake-postgres")
	}
	if g, ok := p.Services["intake-db-setup"]; ok {
		script := strings.Join(g.Command, "\n")
		var sql string
		for _, v := range g.Volumes {
			if v.Target == "/intake.sql" {
				sql = v.Source
			}
		}
		check(strings.HasSuffix(sql, filepath.Join("postgres", "intake.sql")), "intake-db-setup does not mount postgres/intake.sql at /intake.sql")
		check(strings.Contains(script, "-f /intake.sql") && strings.Contains(script, "host=intake-postgres") && strings.Contains(script, "sslmode=verify-full") && strings.Contains(script, "user=postgres"),
			"intake-db-setup must run /intake.sql as the superuser on intake-postgres over verify-full TLS: %s", script)
		check(strings.Contains(script, "ALTER ROLE jetinbox_intake PASSWORD"), "intake-db-setup does not set jetinbox_intake's password")
		check(g.DependsOn["intake-migrate"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "intake-db-setup must run after intake-migrate (intake.sql grants on its tables)")
	}
	if in, ok := p.Services["intake"]; ok {
		cmd := strings.Join(in.Command, " ")
		check(strings.HasPrefix(cmd, "intake ") && strings.Contains(cmd, "-listen 0.0.0.0:") && strings.Contains(cmd, "-http 0.0.0.0:"),
			"intake command %v, want jetinbox intake with -listen and -http on every interface of the container (the defaults are loopback)", in.Command)
		check(strings.Contains(cmd, "-tls-cert /run/jetinbox/") && strings.Contains(cmd, "-tls-key /run/jetinbox/"), "intake must serve TLS: bearer tokens cross the wire: %v", in.Command)
		// jetinbox_intake may not delete keys: the maintainer prunes.
		check(strings.Contains(cmd, "-prune-interval 0"), "intake must run with -prune-interval 0: its role may not delete keys (intake-prune does, as the maintainer): %v", in.Command)
		check(!strings.Contains(cmd, "-unsafe-key-optional"), "intake runs with -unsafe-key-optional")
		check(strings.HasPrefix(env("intake", "JETINBOX_INTAKE_TENANTS"), "/run/jetinbox/"), "intake: JETINBOX_INTAKE_TENANTS %q, want the tenants file secrets-init copies", env("intake", "JETINBOX_INTAKE_TENANTS"))
		for _, k := range []string{"NATS_URL", "NATS_NKEY"} {
			check(env("intake", k) == "", "intake: %s is set: the intake talks to no NATS server", k)
		}
		var drain time.Duration
		for _, f := range []string{"-drain-delay", "-drain-timeout"} {
			i := slices.Index(in.Command, f)
			d, err := time.ParseDuration(func() string {
				if i < 0 || i+1 >= len(in.Command) {
					return ""
				}
				return in.Command[i+1]
			}())
			check(err == nil, "intake: %s is not set explicitly (stop_grace_period must outlast it): %v", f, err)
			drain += d
		}
		check(in.StopGracePeriod != nil && time.Duration(*in.StopGracePeriod) > drain, "intake: stop_grace_period must exceed -drain-delay + -drain-timeout %v", drain)
		check(in.DependsOn["intake-db-setup"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "intake must wait for intake-db-setup (its role) to complete")
		check(len(in.Ports) > 0 && in.Ports[0].HostIP == "127.0.0.1", "intake's ports must be published on the host's loopback only")
	}
	if r, ok := p.Services["intake-relay"]; ok {
		cmd := strings.Join(r.Command, " ")
		check(strings.HasPrefix(cmd, "relay ") && strings.Contains(cmd, "-http 0.0.0.0:"), "intake-relay command %v, want jetinbox relay serving -http on every interface", r.Command)
		check(env("intake-relay", "NATS_NKEY") == "/run/jetinbox/producer_nkey", "intake-relay must publish as the producer NATS user (the intents' producer), not %q", env("intake-relay", "NATS_NKEY"))
		check(r.DependsOn["nats-setup"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "intake-relay must wait for nats-setup (INTENTS) to complete")
		check(r.DependsOn["intake-db-setup"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "intake-relay must wait for intake-db-setup (its grants) to complete")
	}
	if pr, ok := p.Services["intake-prune"]; ok {
		check(slices.Equal(pr.Command, composetypes.ShellCommand{"intake", "-prune"}), "intake-prune command %v, want [intake -prune]", pr.Command)
		check(len(pr.Profiles) > 0, "intake-prune runs at every `up`; give it a profile and run it on a schedule")
	}
}
