package deploy_test

// Every deployment file is read by the parser of the tool that runs it (the
// embedded nats-server's config parser, nats.go's stream and consumer types,
// compose-go, the Kubernetes API types in strict mode, Prometheus's config
// loader and rule parser, PromQL for the dashboard) and then checked for the
// settings jetinbox's guarantees rest on (README.md, "Why each setting
// exists"). Cross-file facts (the stream name in the consumer's env, the
// alert threshold that is 90% of max_ack_pending, the TLS file names the
// generator writes) are checked where they meet. TestMutationsAreRejected
// breaks files on purpose and requires every validator to notice.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	composetypes "github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	prommodel "github.com/prometheus/common/model"
	promconfig "github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/jetinbox/jetinbox/deploy/internal/devsecrets"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

// files is the deploy directory's content by slash path, so that tests can
// validate a mutated copy without touching the real files.
type files map[string][]byte

func loadFiles(t testing.TB) files {
	t.Helper()
	fsys := files{}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == "secrets" || strings.HasPrefix(d.Name(), ".") && p != "." {
				return filepath.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fsys[filepath.ToSlash(p)] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

func (f files) get(name string) ([]byte, error) {
	b, ok := f[name]
	if !ok {
		return nil, fmt.Errorf("%s: missing", name)
	}
	return b, nil
}

// with returns a copy of f where the first occurrence of old in name is new;
// it fails the test if old is not there, so a mutation cannot go stale.
func (f files) with(t testing.TB, name, old, new string) files {
	t.Helper()
	b, ok := f[name]
	if !ok {
		t.Fatalf("mutation: no file %s", name)
	}
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("mutation: %s does not contain %q", name, old)
	}
	c := maps.Clone(f)
	c[name] = bytes.Replace(b, []byte(old), []byte(new), 1)
	return c
}

// secretsFixture is what `go run ./cmd/devsecrets` writes, generated once
// per test binary (TestMain) into a temporary directory.
type secretsFixture struct {
	dir   string
	files []string
	keys  map[string]string
}

var devSecrets *secretsFixture

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "jetinbox-devsecrets-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		tmpl, err := os.ReadFile("nats/auth.conf")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		res, err := devsecrets.Generate(devsecrets.Options{Dir: dir, AuthTemplate: tmpl})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		devSecrets = &secretsFixture{dir: dir, files: res.Files, keys: res.PublicKeys}
		return m.Run()
	}())
}

func fixture(testing.TB) *secretsFixture { return devSecrets }

// ---------------------------------------------------------------------------
// NATS server configuration
// ---------------------------------------------------------------------------

var natsNodes = []string{"nats-1", "nats-2", "nats-3"}

// Permissions the configs must grant, exactly: a change here is a change of
// the security policy and must be deliberate. TestProjectUnderShippedRoles
// runs jetinbox's own producer and consumer under them and checks that they
// use each of these (but $JS.API.INFO) and are refused nothing.
var (
	producerPublish = []string{
		"intents.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.INTENTS", "$JS.API.STREAM.MSG.GET.INTENTS",
		// jsinbox.EnsureStream, which the producer runs at start, looks up
		// the dead-letter and advisory streams too.
		"$JS.API.STREAM.INFO.INTENTS_DLQ", "$JS.API.STREAM.INFO.INTENTS_ADVISORIES",
	}
	consumerPublish = []string{
		"$JS.API.INFO", "$JS.API.STREAM.INFO.INTENTS", "$JS.API.CONSUMER.INFO.INTENTS.ledger", "$JS.API.CONSUMER.MSG.NEXT.INTENTS.ledger",
		"$JS.ACK.INTENTS.ledger.>", "dlq.intents.>", "$JS.API.STREAM.MSG.GET.INTENTS",
		// The ledger durable's max-deliveries advisories, drained from the
		// stream that keeps them: messages the server gave up on are read
		// back with STREAM.MSG.GET and rescued.
		"$JS.API.STREAM.INFO.INTENTS_ADVISORIES", "$JS.API.CONSUMER.INFO.INTENTS_ADVISORIES.ledger",
		"$JS.API.CONSUMER.MSG.NEXT.INTENTS_ADVISORIES.ledger", "$JS.ACK.INTENTS_ADVISORIES.ledger.>",
	}
	clientsSubscribe = []string{"_INBOX.>"}
)

// stageNATS writes the nats/*.conf files of fsys into dir, with the TLS paths
// moved from /etc/nats/tls to tlsDir and, if auth is not nil, auth.conf
// replaced by it. It returns the paths of the node files.
func stageNATS(fsys files, dir, tlsDir string, auth []byte) (map[string]string, error) {
	for name, b := range fsys {
		if !strings.HasPrefix(name, "nats/") || !strings.HasSuffix(name, ".conf") {
			continue
		}
		base := strings.TrimPrefix(name, "nats/")
		if base == "auth.conf" && auth != nil {
			b = auth
		}
		b = bytes.ReplaceAll(b, []byte("/etc/nats/tls/"), []byte(filepath.ToSlash(tlsDir)+"/"))
		if err := os.WriteFile(filepath.Join(dir, base), b, 0o644); err != nil {
			return nil, err
		}
	}
	nodes := map[string]string{}
	for _, n := range natsNodes {
		p := filepath.Join(dir, n+".conf")
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("nats/%s.conf: %w", n, err)
		}
		nodes[n] = p
	}
	return nodes, nil
}

// validateNATSNode parses one node's config with the server's own parser and
// checks what jetinbox depends on.
func validateNATSNode(path, node string) (*server.Options, error) {
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return nil, err
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: "+format, append([]any{node}, args...)...))
		}
	}
	check(opts.ServerName == node, "server_name is %q", opts.ServerName)
	check(opts.JetStream, "jetstream is not enabled")
	check(opts.SyncAlways, "jetstream sync_interval is not \"always\" (a power loss can lose acknowledged publishes)")
	check(opts.StoreDir == "/data", "jetstream store_dir %q, want /data (the volume compose and the chart mount)", opts.StoreDir)
	check(opts.JetStreamMaxStore > 0, "jetstream max_file_store is not set")
	check(opts.TLSConfig != nil && opts.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert, "client TLS with verify: true is not configured")
	check(opts.MaxPayload > 0 && opts.MaxPayload <= 1<<20, "max_payload %d, want 1MB at most", opts.MaxPayload)
	check(opts.LameDuckDuration > 0, "lame_duck_duration is not set")
	check(opts.HTTPPort > 0, "monitoring port (for /healthz) is not set")

	check(opts.Cluster.Name == "jetinbox", "cluster name is %q", opts.Cluster.Name)
	check(opts.Cluster.Port == 6222, "cluster port is %d", opts.Cluster.Port)
	check(opts.Cluster.TLSConfig != nil && opts.Cluster.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert && opts.Cluster.TLSCheckKnownURLs,
		"cluster TLS with verify_cert_and_check_known_urls is not configured")
	var routes []string
	for _, r := range opts.Routes {
		routes = append(routes, r.Hostname())
		check(r.Port() == "6222", "route %s is not on port 6222", r)
	}
	slices.Sort(routes)
	want := slices.DeleteFunc(slices.Clone(natsNodes), func(s string) bool { return s == node })
	check(slices.Equal(routes, want), "routes go to %v, want the other two nodes %v", routes, want)

	check(opts.SystemAccount == "SYS", "system_account is %q", opts.SystemAccount)
	for _, u := range opts.Nkeys {
		check(nkeys.IsValidPublicUserKey(u.Nkey), "user key %q is not a public user nkey", u.Nkey)
	}
	check(len(opts.Users) == 0, "password users are configured; only nkeys are allowed")
	check(len(opts.Nkeys) == 4, "%d nkey users, want producer, consumer, admin, sys", len(opts.Nkeys))
	var producer, consumer int
	for _, u := range opts.Nkeys {
		acc := ""
		if u.Account != nil {
			acc = u.Account.Name
		}
		if u.Permissions == nil {
			check(acc == "JETINBOX" || acc == "SYS", "user %s without permissions in account %q", u.Nkey, acc)
			continue
		}
		check(acc == "JETINBOX", "user %s is in account %q", u.Nkey, acc)
		p := u.Permissions
		check(p.Publish != nil && p.Subscribe != nil, "user %s lacks publish or subscribe permissions", u.Nkey)
		if p.Publish == nil || p.Subscribe == nil {
			continue
		}
		check(len(p.Publish.Deny) == 0 && len(p.Subscribe.Deny) == 0, "user %s: use allow lists only", u.Nkey)
		check(sameSet(p.Subscribe.Allow, clientsSubscribe), "user %s may subscribe to %v, want %v", u.Nkey, p.Subscribe.Allow, clientsSubscribe)
		switch {
		case slices.Contains(p.Publish.Allow, "intents.>"):
			producer++
			check(sameSet(p.Publish.Allow, producerPublish), "producer may publish to %v, want %v", p.Publish.Allow, producerPublish)
		case slices.Contains(p.Publish.Allow, "dlq.intents.>"):
			consumer++
			check(sameSet(p.Publish.Allow, consumerPublish), "consumer may publish to %v, want %v", p.Publish.Allow, consumerPublish)
		default:
			check(false, "user %s has permissions that are neither the producer's nor the consumer's: %v", u.Nkey, p.Publish.Allow)
		}
	}
	check(producer == 1 && consumer == 1, "found %d producer and %d consumer users, want one each", producer, consumer)
	return opts, errors.Join(errs...)
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func validateNATS(fsys files, dir, tlsDir string) error {
	nodes, err := stageNATS(fsys, dir, tlsDir, nil)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range natsNodes {
		if _, err := validateNATSNode(nodes[n], n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func TestNATSConfig(t *testing.T) {
	fsys := loadFiles(t)
	fx := fixture(t)
	if err := validateNATS(fsys, t.TempDir(), filepath.Join(fx.dir, "tls")); err != nil {
		t.Fatal(err)
	}
	// The explanation must stay next to the setting.
	common := string(fsys["nats/common.conf"])
	for _, s := range []string{"sync_interval: always", "Jepsen", "2.12.1", "2 minutes"} {
		if !strings.Contains(common, s) {
			t.Errorf("nats/common.conf: the sync_interval comment lost %q", s)
		}
	}
}

// The template's placeholder keys are real public keys and nothing in the
// deploy tree is a seed.
func TestNoSeedCommitted(t *testing.T) {
	seed := regexp.MustCompile(`\bS[UACON][A-Z2-7]{56}\b`)
	for name, b := range loadFiles(t) {
		if m := seed.Find(b); m != nil {
			if _, err := nkeys.FromSeed(m); err == nil {
				t.Errorf("%s contains an nkey seed", name)
			}
		}
	}
}

// ---------------------------------------------------------------------------
// JetStream stream and consumer definitions
// ---------------------------------------------------------------------------

func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

type jsDefs struct {
	intents, dlq, advisories jetstream.StreamConfig
	ledger, rescue           jetstream.ConsumerConfig
}

func loadJetStream(fsys files) (*jsDefs, error) {
	var d jsDefs
	for name, v := range map[string]any{
		"jetstream/intents-stream.json":         &d.intents,
		"jetstream/dlq-stream.json":             &d.dlq,
		"jetstream/advisories-stream.json":      &d.advisories,
		"jetstream/ledger-consumer.json":        &d.ledger,
		"jetstream/ledger-rescue-consumer.json": &d.rescue,
	} {
		b, err := fsys.get(name)
		if err != nil {
			return nil, err
		}
		if err := decodeStrict(b, v); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return &d, nil
}

func checkStream(name string, c jetstream.StreamConfig, wantName, wantSubject string) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: "+format, append([]any{name}, args...)...))
		}
	}
	check(c.Name == wantName, "name %q, want %q", c.Name, wantName)
	check(slices.Equal(c.Subjects, []string{wantSubject}), "subjects %v, want [%s]", c.Subjects, wantSubject)
	check(c.Retention == jetstream.LimitsPolicy, "retention %v, want limits", c.Retention)
	check(c.Storage == jetstream.FileStorage, "storage %v, want file", c.Storage)
	check(c.Replicas == 3, "num_replicas %d, want 3", c.Replicas)
	// DiscardOld would delete unconsumed intents when the stream is full.
	check(c.Discard == jetstream.DiscardNew, "discard %v, want new", c.Discard)
	check(c.MaxMsgs > 0, "max_msgs must be an explicit limit, is %d", c.MaxMsgs)
	check(c.MaxBytes > 0, "max_bytes must be an explicit limit, is %d", c.MaxBytes)
	check(c.MaxAge > 0, "max_age must be an explicit limit, is %v", c.MaxAge)
	check(c.MaxMsgSize > 0 && c.MaxMsgSize <= 1<<20, "max_msg_size %d, want (0, 1MiB]", c.MaxMsgSize)
	check(c.Duplicates == 2*time.Minute, "duplicate_window %v, want 2m", c.Duplicates)
	check(c.DenyDelete, "deny_delete must be true")
	check(c.DenyPurge, "deny_purge must be true")
	check(!c.AllowRollup, "allow_rollup_hdrs must be false (a rollup deletes messages)")
	check(!c.AllowMsgTTL, "allow_msg_ttl must be false (a TTL deletes messages)")
	check(!c.NoAck, "no_ack must be false")
	check(!c.Sealed, "sealed must be false")
	check(c.PersistMode == jetstream.DefaultPersistMode, "persist_mode must be default (async acks before the write is stored)")
	check(c.Mirror == nil && len(c.Sources) == 0, "mirror/sources are not expected")
	return errors.Join(errs...)
}

func validateJetStream(fsys files) error {
	d, err := loadJetStream(fsys)
	if err != nil {
		return err
	}
	errs := []error{
		checkStream("intents-stream.json", d.intents, "INTENTS", "intents.>"),
		checkStream("dlq-stream.json", d.dlq, "INTENTS_DLQ", "dlq.intents.>"),
	}
	c := d.ledger
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("ledger-consumer.json: "+format, args...))
		}
	}
	check(c.Durable == "ledger" && c.Name == "ledger", "durable_name/name %q/%q, want ledger", c.Durable, c.Name)
	check(c.DeliverSubject == "", "deliver_subject set: jetinbox uses a pull consumer")
	check(c.AckPolicy == jetstream.AckExplicitPolicy, "ack_policy %v, want explicit", c.AckPolicy)
	check(c.AckWait == 30*time.Second, "ack_wait %v, want 30s", c.AckWait)
	check(c.MaxDeliver > 0 && c.MaxDeliver == 20, "max_deliver %d, want 20 (finite)", c.MaxDeliver)
	check(c.MaxAckPending == 4000, "max_ack_pending %d, want 4000 (bounded)", c.MaxAckPending)
	check(c.MaxWaiting == 64, "max_waiting %d, want 64", c.MaxWaiting)
	check(c.DeliverPolicy == jetstream.DeliverAllPolicy, "deliver_policy %v, want all", c.DeliverPolicy)
	check(c.FilterSubject == "intents.>" && len(c.FilterSubjects) == 0, "filter_subject %q, want intents.>", c.FilterSubject)
	check(c.InactiveThreshold == 0, "inactive_threshold set: a durable must never be removed for idling")
	check(c.Replicas == 0 || c.Replicas == 3, "num_replicas %d, want the stream's 3", c.Replicas)
	check(!c.MemoryStorage, "mem_storage must be false")
	check(len(c.BackOff) == 0, "backoff set: it does not apply to naks; the consumer computes its own jittered delays")
	errs = append(errs, checkAdvisories(d), checkRescue(d))
	return errors.Join(errs...)
}

// checkAdvisories compares advisories-stream.json with the stream jsinbox
// creates when it is missing (what the library's rescue relies on), for the
// deploy's intents stream.
func checkAdvisories(d *jsDefs) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("advisories-stream.json: "+format, args...))
		}
	}
	c := d.advisories
	want := jsinbox.StreamConfig{Name: d.intents.Name, Subjects: d.intents.Subjects, Replicas: d.intents.Replicas, MaxAge: d.intents.MaxAge}.AdvisoryConfig()
	check(c.Name == want.Name, "name %q, want %q", c.Name, want.Name)
	check(slices.Equal(c.Subjects, want.Subjects), "subjects %v, want %v: every max-deliveries advisory of the %s consumers", c.Subjects, want.Subjects, d.intents.Name)
	check(c.Retention == jetstream.LimitsPolicy, "retention %v, want limits", c.Retention)
	check(c.Storage == jetstream.FileStorage, "storage %v, want file: a restart would lose the advisories of messages to rescue", c.Storage)
	check(c.Replicas == d.intents.Replicas, "num_replicas %d, want the intents stream's %d", c.Replicas, d.intents.Replicas)
	check(c.Discard == want.Discard, "discard %v, want %v", c.Discard, want.Discard)
	check(c.MaxMsgs == want.MaxMsgs && c.MaxBytes == want.MaxBytes, "max_msgs/max_bytes %d/%d, want jsinbox's %d/%d", c.MaxMsgs, c.MaxBytes, want.MaxMsgs, want.MaxBytes)
	// A rescue needs the advisory and the message it names: keep both as long.
	check(c.MaxAge == d.intents.MaxAge, "max_age %v, want the intents stream's %v", c.MaxAge, d.intents.MaxAge)
	check(c.DenyDelete && c.DenyPurge, "deny_delete and deny_purge must be true: a deleted advisory is a message never rescued")
	check(!c.AllowRollup && !c.AllowMsgTTL, "allow_rollup_hdrs and allow_msg_ttl must be false")
	check(!c.NoAck && !c.Sealed, "no_ack and sealed must be false")
	check(c.PersistMode == jetstream.DefaultPersistMode, "persist_mode must be default")
	check(c.Mirror == nil && len(c.Sources) == 0, "mirror/sources are not expected")
	return errors.Join(errs...)
}

// maxDeliveriesSubject is the subject of a durable's max-deliveries
// advisories.
func maxDeliveriesSubject(stream, durable string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + durable
}

// checkRescue: ledger-rescue-consumer.json is the consumer jsinbox looks up
// (or creates) on the advisory stream for the ledger durable.
func checkRescue(d *jsDefs) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("ledger-rescue-consumer.json: "+format, args...))
		}
	}
	c := d.rescue
	check(c.Durable == d.ledger.Durable && c.Name == d.ledger.Durable, "durable_name/name %q/%q, want the intents durable's name %q", c.Durable, c.Name, d.ledger.Durable)
	want := maxDeliveriesSubject(d.intents.Name, d.ledger.Durable)
	check(c.FilterSubject == want && len(c.FilterSubjects) == 0, "filter_subject %q, want %q (its own durable's advisories only)", c.FilterSubject, want)
	check(c.DeliverSubject == "", "deliver_subject set: jsinbox pulls")
	check(c.DeliverPolicy == jetstream.DeliverAllPolicy, "deliver_policy %v, want all: advisories kept while no consumer ran are rescued too", c.DeliverPolicy)
	check(c.AckPolicy == jetstream.AckExplicitPolicy, "ack_policy %v, want explicit", c.AckPolicy)
	check(c.AckWait == d.ledger.AckWait, "ack_wait %v, want ledger-consumer.json's %v", c.AckWait, d.ledger.AckWait)
	check(c.MaxDeliver == -1, "max_deliver %d, want -1: a rescue that fails for a passing reason is tried again, never given up", c.MaxDeliver)
	check(c.MaxAckPending == 64, "max_ack_pending %d, want 64", c.MaxAckPending)
	check(c.InactiveThreshold == 0, "inactive_threshold set: a durable must never be removed for idling")
	check(c.Replicas == 0 || c.Replicas == d.advisories.Replicas, "num_replicas %d, want the stream's %d", c.Replicas, d.advisories.Replicas)
	check(!c.MemoryStorage, "mem_storage must be false")
	check(len(c.BackOff) == 0, "backoff set: the consumer computes its own jittered delays")
	return errors.Join(errs...)
}

func TestJetStreamDefinitions(t *testing.T) {
	if err := validateJetStream(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// compose
// ---------------------------------------------------------------------------

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

	want := []string{"consumer", "db-grants", "migrate", "nats-1", "nats-2", "nats-3", "nats-setup", "postgres", "producer", "prometheus"}
	got := slices.Sorted(maps.Keys(p.Services))
	check(slices.Equal(got, want), "services %v, want %v", got, want)

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
		for k, v := range s.Environment {
			if v == nil {
				check(false, "service %s: %s has no value", name, k)
				continue
			}
			for _, m := range regexp.MustCompile(`/run/secrets/[A-Za-z0-9_.-]+`).FindAllString(*v, -1) {
				check(attached[m], "service %s: %s refers to %s, which is not attached", name, k, m)
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
		for _, f := range []string{"advisories-stream.json", "ledger-rescue-consumer.json", "intents-stream.json", "dlq-stream.json", "ledger-consumer.json"} {
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
	for _, svc := range []string{"consumer", "producer", "migrate"} {
		s, ok := p.Services[svc]
		if !ok {
			continue
		}
		check(s.Build != nil, "%s is not built from deploy/Dockerfile", svc)
		check(len(s.Entrypoint) > 0 && binaries[s.Entrypoint[0]], "%s entrypoint %v is not a binary deploy/Dockerfile installs (%v)", svc, s.Entrypoint, slices.Sorted(maps.Keys(binaries)))
		check(s.ReadOnly, "%s must run with a read-only root filesystem", svc)
		check(s.User != "" && !strings.HasPrefix(s.User, "0"), "%s must run as a non-root user", svc)
	}
	for _, svc := range []string{"consumer", "producer"} {
		for _, k := range []string{"NATS_URL", "NATS_NKEY", "NATS_CA", "NATS_CERT", "NATS_KEY", "JETINBOX_STREAM"} {
			check(env(svc, k) != "", "%s: %s is not set", svc, k)
		}
		check(env(svc, "JETINBOX_STREAM") == js.intents.Name, "%s: JETINBOX_STREAM %q, the stream is %q", svc, env(svc, "JETINBOX_STREAM"), js.intents.Name)
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
	check(env("consumer", "JETINBOX_DURABLE") == js.ledger.Durable, "consumer: JETINBOX_DURABLE %q, the durable is %q", env("consumer", "JETINBOX_DURABLE"), js.ledger.Durable)
	for _, svc := range []string{"consumer", "migrate"} {
		check(strings.Contains(env(svc, "DATABASE_URL"), "sslmode=verify-full"), "%s: DATABASE_URL must use sslmode=verify-full", svc)
	}
	check(strings.Contains(env("consumer", "DATABASE_URL"), "jetinbox_consumer@"), "consumer must connect as jetinbox_consumer")
	check(strings.Contains(env("migrate", "DATABASE_URL"), "jetinbox_migrator@"), "migrate must connect as jetinbox_migrator")
	if c, ok := p.Services["consumer"]; ok {
		drain, err := time.ParseDuration(env("consumer", "JETINBOX_DRAIN_TIMEOUT"))
		check(err == nil, "consumer: JETINBOX_DRAIN_TIMEOUT: %v", err)
		check(c.StopGracePeriod != nil && time.Duration(*c.StopGracePeriod) > drain, "consumer: stop_grace_period must exceed JETINBOX_DRAIN_TIMEOUT %v", drain)
		check(c.DependsOn["nats-setup"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "consumer must wait for nats-setup to complete")
		check(c.DependsOn["db-grants"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "consumer must wait for db-grants to complete")
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

// applyOrder reports whether text names the advisory stream's and the rescue
// consumer's files (after prefix) before the intents stream's: a consumer
// of the intents stream can then never see a max-deliveries advisory sent
// with nowhere to keep it.
func applyOrder(text, prefix string) bool {
	adv := strings.Index(text, prefix+"advisories-stream.json")
	rescue := strings.Index(text, prefix+"ledger-rescue-consumer.json")
	intents := strings.Index(text, prefix+"intents-stream.json")
	return adv >= 0 && rescue > adv && intents > rescue
}

var dockerfileCopy = regexp.MustCompile(`(?m)^COPY --from=build ((?:/out/[a-z]+ )+)(/\S+/)$`)

// dockerfileBinaries returns the paths of the binaries deploy/Dockerfile puts
// into its final image.
func dockerfileBinaries(fsys files) map[string]bool {
	m := dockerfileCopy.FindSubmatch(fsys["Dockerfile"])
	out := map[string]bool{}
	if m == nil {
		return out
	}
	for _, f := range strings.Fields(string(m[1])) {
		out[string(m[2])+filepath.Base(f)] = true
	}
	return out
}

func validateDockerfile(fsys files) error {
	b, err := fsys.get("Dockerfile")
	if err != nil {
		return err
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("Dockerfile: "+format, args...))
		}
	}
	s := string(b)
	froms := regexp.MustCompile(`(?m)^FROM (\S+)`).FindAllStringSubmatch(s, -1)
	check(len(froms) == 2, "want two stages, found %d", len(froms))
	if len(froms) == 2 {
		check(strings.HasPrefix(froms[0][1], "golang:1.26"), "build stage %q, want golang:1.26", froms[0][1])
		check(strings.HasPrefix(froms[1][1], "gcr.io/distroless/"), "runtime stage %q, want distroless", froms[1][1])
	}
	build := regexp.MustCompile(`go build [^\n]*`).FindString(s)
	for _, c := range []string{"./cmd/consumer", "./cmd/producer", "./cmd/jetinbox"} {
		check(strings.Contains(build, c), "go build does not build %s", c)
	}
	bins := dockerfileBinaries(fsys)
	for _, b := range []string{"consumer", "producer", "jetinbox"} {
		check(bins["/usr/local/bin/"+b], "final image lacks /usr/local/bin/%s", b)
	}
	check(regexp.MustCompile(`(?m)^USER (65532|nonroot)`).MatchString(s), "final image must run as a non-root USER")
	return errors.Join(errs...)
}

// imageAtLeast reports whether image is repo:X.Y.Z[-suffix] with X.Y.Z >= min.
func imageAtLeast(image, repo string, min [3]int) bool {
	r, tag, ok := strings.Cut(image, ":")
	if !ok || r != repo {
		return false
	}
	tag, _, _ = strings.Cut(tag, "-")
	parts := strings.Split(tag, ".")
	if len(parts) != 3 {
		return false
	}
	var v [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return false
		}
		v[i] = n
	}
	for i := range v {
		if v[i] != min[i] {
			return v[i] > min[i]
		}
	}
	return true
}

// validateReadme checks the operator steps of README.md against the files:
// the Kubernetes steps apply every stream and consumer definition, the
// advisory stream and the rescue consumer first, each to its stream.
func validateReadme(fsys files) error {
	b, err := fsys.get("README.md")
	if err != nil {
		return err
	}
	js, err := loadJetStream(fsys)
	if err != nil {
		return err
	}
	readme := string(b)
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("README.md: "+format, args...))
		}
	}
	for name := range fsys {
		if f, ok := strings.CutPrefix(name, "jetstream/"); ok {
			check(strings.Contains(readme, "< deploy/"+name+"\n"), "the Kubernetes steps do not apply %s", name)
			check(strings.Contains(readme, "`"+f+"`") || strings.Contains(readme, "`"+name+"`"), "the files table does not list %s", name)
		}
	}
	for _, c := range []struct {
		stream string
		cons   jetstream.ConsumerConfig
		file   string
	}{{js.advisories.Name, js.rescue, "ledger-rescue-consumer.json"}, {js.intents.Name, js.ledger, "ledger-consumer.json"}} {
		cmd := fmt.Sprintf("nats consumer add %s %s --config /dev/stdin < deploy/jetstream/%s", c.stream, c.cons.Durable, c.file)
		check(strings.Contains(readme, cmd), "the Kubernetes steps do not run %q", cmd)
	}
	check(applyOrder(readme, "< deploy/jetstream/"), "the Kubernetes steps must create the advisory stream and the rescue consumer before the intents stream")
	return errors.Join(errs...)
}

func TestReadme(t *testing.T) {
	if err := validateReadme(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}

func TestCompose(t *testing.T) {
	fsys := loadFiles(t)
	if err := validateCompose(fsys, fixture(t)); err != nil {
		t.Fatal(err)
	}
}

func TestDockerfile(t *testing.T) {
	if err := validateDockerfile(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// Kubernetes
// ---------------------------------------------------------------------------

// decodeK8s strictly decodes one YAML document: unknown or duplicate fields
// are errors, as with `kubectl apply --validate=strict`.
func decodeK8s(fsys files, name string, v any) error {
	b, err := fsys.get(name)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

type k8sSet struct {
	deploy  appsv1.Deployment
	svc     corev1.Service
	pdb     policyv1.PodDisruptionBudget
	job     batchv1.Job
	secrets map[string]corev1.Secret
}

func loadK8s(fsys files) (*k8sSet, error) {
	var k k8sSet
	for name, v := range map[string]any{
		"kubernetes/consumer-deployment.yaml": &k.deploy,
		"kubernetes/consumer-service.yaml":    &k.svc,
		"kubernetes/consumer-pdb.yaml":        &k.pdb,
		"kubernetes/migrate-job.yaml":         &k.job,
	} {
		if err := decodeK8s(fsys, name, v); err != nil {
			return nil, err
		}
	}
	b, err := fsys.get("kubernetes/secrets.template.yaml")
	if err != nil {
		return nil, err
	}
	k.secrets = map[string]corev1.Secret{}
	for i, doc := range splitYAML(b) {
		var s corev1.Secret
		if err := yaml.UnmarshalStrict(doc, &s); err != nil {
			return nil, fmt.Errorf("kubernetes/secrets.template.yaml document %d: %w", i+1, err)
		}
		k.secrets[s.Name] = s
	}
	return &k, nil
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

func findContainer(cs []corev1.Container, name string) (corev1.Container, bool) {
	for _, c := range cs {
		if c.Name == name {
			return c, true
		}
	}
	return corev1.Container{}, false
}

func validateK8s(fsys files) error {
	k, err := loadK8s(fsys)
	if err != nil {
		return err
	}
	js, err := loadJetStream(fsys)
	if err != nil {
		return err
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("kubernetes: "+format, args...))
		}
	}
	typeMeta := func(name, apiVersion, kind, gotAPI, gotKind string) {
		check(gotAPI == apiVersion && gotKind == kind, "%s is %s %s, want %s %s", name, gotAPI, gotKind, apiVersion, kind)
	}
	typeMeta("consumer-deployment.yaml", "apps/v1", "Deployment", k.deploy.APIVersion, k.deploy.Kind)
	typeMeta("consumer-service.yaml", "v1", "Service", k.svc.APIVersion, k.svc.Kind)
	typeMeta("consumer-pdb.yaml", "policy/v1", "PodDisruptionBudget", k.pdb.APIVersion, k.pdb.Kind)
	typeMeta("migrate-job.yaml", "batch/v1", "Job", k.job.APIVersion, k.job.Kind)

	// The Secrets template: names and keys, never values.
	secretKeys := map[string]map[string]bool{}
	for name, s := range k.secrets {
		typeMeta("secrets.template.yaml "+name, "v1", "Secret", s.APIVersion, s.Kind)
		check(len(s.Data) == 0, "secrets.template.yaml %s has data: values must never be committed", name)
		secretKeys[name] = map[string]bool{}
		for key, v := range s.StringData {
			check(v == "", "secrets.template.yaml %s key %s has a value: values must never be committed", name, key)
			secretKeys[name][key] = true
		}
	}
	// Volumes and env of a pod must use only the Secrets and keys above.
	checkPodSecrets := func(what string, spec corev1.PodSpec) map[string]string {
		mounted := map[string]string{} // volume name -> secret name
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				_, ok := secretKeys[v.Secret.SecretName]
				check(ok, "%s mounts Secret %s, which secrets.template.yaml does not describe", what, v.Secret.SecretName)
				mounted[v.Name] = v.Secret.SecretName
				check(v.Secret.DefaultMode != nil && *v.Secret.DefaultMode&0o007 == 0, "%s: Secret volume %s must not be world-readable", what, v.Name)
			}
		}
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			paths := map[string]string{} // mount path -> secret
			for _, m := range c.VolumeMounts {
				if s, ok := mounted[m.Name]; ok {
					paths[m.MountPath] = s
					check(m.ReadOnly, "%s/%s: Secret mount %s must be read-only", what, c.Name, m.MountPath)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					r := e.ValueFrom.SecretKeyRef
					check(secretKeys[r.Name][r.Key], "%s/%s: %s reads Secret %s key %s, which secrets.template.yaml does not describe", what, c.Name, e.Name, r.Name, r.Key)
				}
				// An env value that is a file in a mounted Secret names a key of it.
				for dir, s := range paths {
					for _, m := range regexp.MustCompile(regexp.QuoteMeta(dir)+`/([A-Za-z0-9_.-]+)`).FindAllStringSubmatch(e.Value, -1) {
						check(secretKeys[s][m[1]], "%s/%s: %s refers to %s/%s, but Secret %s has no key %s", what, c.Name, e.Name, dir, m[1], s, m[1])
					}
				}
			}
		}
		return mounted
	}

	// The consumer Deployment.
	d := k.deploy
	spec := d.Spec.Template.Spec
	check(d.Spec.Replicas != nil && *d.Spec.Replicas >= 2, "consumer replicas must be 2 or more")
	check(d.Spec.Selector != nil && labelsMatch(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels), "Deployment selector does not match its pod labels")
	c, ok := findContainer(spec.Containers, "consumer")
	check(ok, "Deployment has no container named consumer")
	env := envOf(c)
	for _, name := range []string{"NATS_URL", "NATS_NKEY", "NATS_CA", "NATS_CERT", "NATS_KEY", "DATABASE_URL", "JETINBOX_STREAM", "JETINBOX_SCOPE", "JETINBOX_DURABLE", "JETINBOX_HTTP_ADDR", "JETINBOX_DRAIN_TIMEOUT"} {
		check(env[name].Value != "", "consumer env %s is not set", name)
	}
	check(env["JETINBOX_STREAM"].Value == js.intents.Name, "consumer JETINBOX_STREAM %q, the stream is %q", env["JETINBOX_STREAM"].Value, js.intents.Name)
	check(env["JETINBOX_DURABLE"].Value == js.ledger.Durable, "consumer JETINBOX_DURABLE %q, the durable is %q", env["JETINBOX_DURABLE"].Value, js.ledger.Durable)
	check(strings.HasPrefix(env["NATS_URL"].Value, "tls://"), "consumer NATS_URL must be tls://")
	check(strings.Contains(env["DATABASE_URL"].Value, "sslmode=verify-full"), "consumer DATABASE_URL must use sslmode=verify-full")
	check(!regexp.MustCompile(`://[^/@]*:[^/@]*@`).MatchString(env["DATABASE_URL"].Value), "consumer DATABASE_URL must not carry a password")
	drain, err := time.ParseDuration(env["JETINBOX_DRAIN_TIMEOUT"].Value)
	check(err == nil && drain >= 30*time.Second, "consumer JETINBOX_DRAIN_TIMEOUT %q", env["JETINBOX_DRAIN_TIMEOUT"].Value)
	check(spec.TerminationGracePeriodSeconds != nil && time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second > drain,
		"terminationGracePeriodSeconds must exceed the drain timeout %v", drain)
	_, portStr, _ := strings.Cut(env["JETINBOX_HTTP_ADDR"].Value, ":")
	port, _ := strconv.Atoi(portStr)
	var httpPort int32
	for _, p := range c.Ports {
		if p.Name == "http" {
			httpPort = p.ContainerPort
		}
	}
	check(httpPort != 0 && int(httpPort) == port, "container port http %d does not match JETINBOX_HTTP_ADDR %q", httpPort, env["JETINBOX_HTTP_ADDR"].Value)
	probe := func(name string, p *corev1.Probe, path string) {
		check(p != nil && p.HTTPGet != nil && p.HTTPGet.Path == path && p.HTTPGet.Port.String() == "http",
			"consumer %s must be an HTTP GET of %s on port http", name, path)
	}
	probe("livenessProbe", c.LivenessProbe, "/healthz")
	probe("readinessProbe", c.ReadinessProbe, "/readyz")
	check(c.Resources.Requests.Cpu().Sign() > 0 && c.Resources.Requests.Memory().Sign() > 0, "consumer needs cpu and memory requests")
	check(c.Resources.Limits.Memory().Sign() > 0, "consumer needs a memory limit")
	checkSecure := func(what string, ps *corev1.PodSecurityContext, sc *corev1.SecurityContext) {
		nonRoot := (ps != nil && ps.RunAsNonRoot != nil && *ps.RunAsNonRoot) || (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot)
		check(nonRoot, "%s must set runAsNonRoot", what)
		check(sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem, "%s must have a read-only root filesystem", what)
		check(sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation, "%s must set allowPrivilegeEscalation: false", what)
		check(sc != nil && sc.Capabilities != nil && slices.Contains(sc.Capabilities.Drop, "ALL"), "%s must drop ALL capabilities", what)
	}
	checkSecure("consumer", spec.SecurityContext, c.SecurityContext)
	checkPodSecrets("consumer Deployment", spec)

	// Service and PDB select the consumer pods.
	check(labelsMatch(k.svc.Spec.Selector, d.Spec.Template.Labels) && len(k.svc.Spec.Selector) > 0, "Service selector does not select the consumer pods")
	check(len(k.svc.Spec.Ports) == 1 && k.svc.Spec.Ports[0].TargetPort.String() == "http", "Service must target port http")
	check(k.pdb.Spec.Selector != nil && labelsMatch(k.pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels), "PDB selector does not select the consumer pods")
	check(k.pdb.Spec.MinAvailable != nil && d.Spec.Replicas != nil && k.pdb.Spec.MinAvailable.IntValue() < int(*d.Spec.Replicas),
		"PDB minAvailable must be below the replica count, or no node can ever be drained")

	// The migrate Job.
	j := k.job
	jspec := j.Spec.Template.Spec
	check(jspec.RestartPolicy == corev1.RestartPolicyNever || jspec.RestartPolicy == corev1.RestartPolicyOnFailure, "Job restartPolicy %q", jspec.RestartPolicy)
	check(j.Spec.BackoffLimit != nil && *j.Spec.BackoffLimit > 0, "Job needs a backoffLimit")
	check(j.Spec.ActiveDeadlineSeconds != nil, "Job needs an activeDeadlineSeconds")
	m, ok := findContainer(jspec.InitContainers, "migrate")
	check(ok && slices.Equal(m.Command, []string{"/usr/local/bin/jetinbox", "migrate"}), "Job needs an init container migrate running `jetinbox migrate`")
	check(strings.Contains(envOf(m)["DATABASE_URL"].Value, "jetinbox_migrator@") && strings.Contains(envOf(m)["DATABASE_URL"].Value, "sslmode=verify-full"),
		"migrate must connect as jetinbox_migrator with sslmode=verify-full")
	g, ok := findContainer(jspec.Containers, "grants")
	check(ok && slices.Contains(g.Command, "/etc/jetinbox/sql/grants.sql"), "Job needs a container grants running grants.sql")
	check(envOf(g)["PGSSLMODE"].Value == "verify-full", "grants must use PGSSLMODE=verify-full")
	for _, c := range slices.Concat(jspec.InitContainers, jspec.Containers) {
		checkSecure("Job container "+c.Name, jspec.SecurityContext, c.SecurityContext)
	}
	var grantsCM bool
	for _, v := range jspec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == "jetinbox-grants" {
			grantsCM = true
		}
	}
	check(grantsCM, "Job must mount the ConfigMap jetinbox-grants (made from postgres/grants.sql)")
	checkPodSecrets("migrate Job", jspec)

	// The kustomization lists existing files.
	var kust struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
		Images     []struct {
			Name    string `json:"name"`
			NewName string `json:"newName,omitempty"`
			NewTag  string `json:"newTag,omitempty"`
		} `json:"images"`
	}
	if err := decodeK8s(fsys, "kubernetes/kustomization.yaml", &kust); err != nil {
		errs = append(errs, err)
	}
	check(kust.Kind == "Kustomization", "kustomization.yaml kind %q", kust.Kind)
	for _, r := range kust.Resources {
		_, ok := fsys["kubernetes/"+r]
		check(ok, "kustomization.yaml lists %s, which does not exist", r)
	}
	return errors.Join(errs...)
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestKubernetesManifests(t *testing.T) {
	if err := validateK8s(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}

// natsValues mirrors the part of the official NATS Helm chart's values.yaml
// (nats-io/k8s, chart 2.x) that nats-values.yaml sets; decoded strictly, so a
// misspelt key is an error instead of a silently ignored value. The merge
// blocks are NATS config and are checked by the server's parser below.
type natsValues struct {
	Config struct {
		Cluster struct {
			Enabled  bool     `json:"enabled"`
			Replicas int      `json:"replicas"`
			TLS      chartTLS `json:"tls"`
		} `json:"cluster"`
		JetStream struct {
			Enabled   bool `json:"enabled"`
			FileStore struct {
				Enabled bool   `json:"enabled"`
				Dir     string `json:"dir"`
				PVC     struct {
					Enabled          bool   `json:"enabled"`
					Size             string `json:"size"`
					StorageClassName string `json:"storageClassName,omitempty"`
				} `json:"pvc"`
			} `json:"fileStore"`
			MemoryStore struct {
				Enabled bool `json:"enabled"`
			} `json:"memoryStore"`
			Merge map[string]any `json:"merge"`
		} `json:"jetstream"`
		NATS struct {
			TLS chartTLS `json:"tls"`
		} `json:"nats"`
		Monitor struct {
			Enabled bool `json:"enabled"`
		} `json:"monitor"`
		Merge map[string]any `json:"merge"`
	} `json:"config"`
	TLSCA struct {
		Enabled    bool   `json:"enabled"`
		SecretName string `json:"secretName"`
		Key        string `json:"key"`
	} `json:"tlsCA"`
	Container struct {
		Image struct {
			Tag string `json:"tag"`
		} `json:"image"`
		Merge map[string]any `json:"merge"`
		Patch []jsonPatch    `json:"patch"`
	} `json:"container"`
	PodTemplate struct {
		TopologySpreadConstraints map[string]map[string]any `json:"topologySpreadConstraints"`
		Patch                     []jsonPatch               `json:"patch"`
	} `json:"podTemplate"`
	PodDisruptionBudget struct {
		Enabled bool `json:"enabled"`
	} `json:"podDisruptionBudget"`
	PromExporter struct {
		Enabled bool `json:"enabled"`
	} `json:"promExporter"`
	NatsBox struct {
		Enabled  bool `json:"enabled"`
		Contexts map[string]struct {
			Nkey struct {
				SecretName string `json:"secretName"`
			} `json:"nkey"`
			TLS struct {
				SecretName string `json:"secretName"`
			} `json:"tls"`
		} `json:"contexts"`
	} `json:"natsBox"`
}

type chartTLS struct {
	Enabled    bool           `json:"enabled"`
	SecretName string         `json:"secretName"`
	Merge      map[string]any `json:"merge"`
}

type jsonPatch struct {
	Op    string         `json:"op"`
	Path  string         `json:"path"`
	Value map[string]any `json:"value"`
}

// natsConfFromValues renders the parts of nats.conf the chart would build
// from v's merge blocks, so that the NATS parser can judge them. The chart's
// "<< x >>" marks an unquoted value.
func natsConfFromValues(v natsValues, tlsDir string) string {
	render := func(m map[string]any) string {
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(m)) {
			val := m[k]
			if s, ok := val.(string); ok && strings.HasPrefix(s, "<<") && strings.HasSuffix(s, ">>") {
				fmt.Fprintf(&b, "%s: %s\n", k, strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(s, "<<"), ">>")))
				continue
			}
			j, _ := json.Marshal(val)
			fmt.Fprintf(&b, "%s: %s\n", k, j)
		}
		return b.String()
	}
	tls := func(merge map[string]any) string {
		return fmt.Sprintf("tls {\ncert_file: %q\nkey_file: %q\nca_file: %q\n%s}\n",
			filepath.Join(tlsDir, "nats-server.pem"), filepath.Join(tlsDir, "nats-server-key.pem"), filepath.Join(tlsDir, "ca.pem"), render(merge))
	}
	top := maps.Clone(v.Config.Merge)
	for k := range top {
		if strings.HasSuffix(k, "$include") {
			delete(top, k)
		}
	}
	return fmt.Sprintf("server_name: nats-0\n%s%sjetstream {\nstore_dir: %q\n%s}\ncluster {\nname: nats\nport: 6222\nroutes: [\"tls://nats-1.nats-headless:6222\"]\n%s}\n",
		render(top), tls(v.Config.NATS.TLS.Merge), v.Config.JetStream.FileStore.Dir, render(v.Config.JetStream.Merge), tls(v.Config.Cluster.TLS.Merge))
}

func validateHelmValues(fsys files, tlsDir string) error {
	var v natsValues
	if err := decodeK8s(fsys, "kubernetes/nats-values.yaml", &v); err != nil {
		return err
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("nats-values.yaml: "+format, args...))
		}
	}
	c := v.Config
	check(c.Cluster.Enabled && c.Cluster.Replicas == 3, "cluster must be enabled with 3 replicas")
	check(c.JetStream.Enabled && c.JetStream.FileStore.Enabled && c.JetStream.FileStore.PVC.Enabled, "JetStream with a file store on a PVC is required")
	check(c.JetStream.Merge["sync_interval"] == "always", "config.jetstream.merge.sync_interval must be \"always\"")
	check(c.NATS.TLS.Enabled && c.NATS.TLS.SecretName != "" && c.NATS.TLS.Merge["verify"] == true, "client TLS with verify: true is required")
	check(c.Cluster.TLS.Enabled && c.Cluster.TLS.SecretName != "", "route TLS is required")
	check(v.TLSCA.Enabled && v.TLSCA.SecretName != "", "tlsCA is required")
	check(imageAtLeast("nats:"+v.Container.Image.Tag, "nats", [3]int{2, 12, 3}), "image tag %q, want 2.12.3 or later", v.Container.Image.Tag)

	// The auth include must reach the ConfigMap mount added by the patches.
	var include string
	for k, val := range c.Merge {
		if strings.HasSuffix(k, "$include") {
			include, _ = val.(string)
		}
	}
	mountPath := ""
	for _, p := range v.Container.Patch {
		if p.Op == "add" && p.Path == "/volumeMounts/-" && p.Value["name"] == "nats-auth" {
			mountPath, _ = p.Value["mountPath"].(string)
		}
	}
	var volume bool
	for _, p := range v.PodTemplate.Patch {
		if p.Op == "add" && p.Path == "/spec/volumes/-" && p.Value["name"] == "nats-auth" {
			volume = true
		}
	}
	check(volume, "podTemplate.patch must add the nats-auth volume")
	box := v.NatsBox.Contexts["default"]
	check(!v.NatsBox.Enabled || box.Nkey.SecretName != "" && box.TLS.SecretName != "", "nats-box's default context needs an nkey and a client certificate (the server requires both)")
	// The chart's nats.conf lives in /etc/nats-config; includes are relative to it.
	check(mountPath != "" && include != "" && filepath.Join("/etc/nats-config", include) == filepath.Join(mountPath, "auth.conf"),
		"config.merge include %q does not reach auth.conf in the nats-auth mount %q", include, mountPath)

	// The merge blocks are NATS config: let the server's parser judge them.
	conf := natsConfFromValues(v, tlsDir)
	opts := &server.Options{}
	if err := opts.ProcessConfigString(conf); err != nil {
		errs = append(errs, fmt.Errorf("nats-values.yaml: the rendered NATS config does not parse: %w\n%s", err, conf))
	} else {
		check(opts.SyncAlways, "rendered config: sync_interval is not always")
		check(opts.TLSConfig != nil && opts.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert, "rendered config: client TLS does not verify clients")
		check(opts.Cluster.TLSCheckKnownURLs, "rendered config: routes do not check known URLs")
	}
	return errors.Join(errs...)
}

func TestHelmValues(t *testing.T) {
	fx := fixture(t)
	if err := validateHelmValues(loadFiles(t), filepath.Join(fx.dir, "tls")); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// Prometheus and Grafana
// ---------------------------------------------------------------------------

var jetinboxMetrics = []string{
	"jetinbox_applied_total",
	"jetinbox_duplicates_total",
	"jetinbox_dead_letters_total",
	"jetinbox_redeliveries_total",
	"jetinbox_conflicts_total",
	"jetinbox_consumer_pending_messages",
	"jetinbox_consumer_ack_pending_messages",
	"jetinbox_verify_violations",
	"jetinbox_batch_duration_seconds",
	"jetinbox_publish_to_commit_seconds",
}

// metricsIn returns the metric names an expression selects, with histogram
// suffixes folded to the histogram's name.
func metricsIn(expr parser.Expr) map[string]bool {
	out := map[string]bool{}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, suf := range []string{"_bucket", "_count", "_sum"} {
				name = strings.TrimSuffix(name, suf)
			}
			out[name] = true
		}
		return nil
	})
	return out
}

// numbersIn returns the number literals of an expression.
func numbersIn(expr parser.Expr) []float64 {
	var out []float64
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if nl, ok := n.(*parser.NumberLiteral); ok {
			out = append(out, nl.Val)
		}
		return nil
	})
	return out
}

var promQL = parser.NewParser(parser.Options{})

func validateAlerts(fsys files) error {
	b, err := fsys.get("prometheus/alerts.yml")
	if err != nil {
		return err
	}
	groups, errs := rulefmt.Parse(b, false, prommodel.UTF8Validation, promQL, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		return fmt.Errorf("prometheus/alerts.yml: %w", errors.Join(errs...))
	}
	js, err := loadJetStream(fsys)
	if err != nil {
		return err
	}
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("prometheus/alerts.yml: "+format, args...))
		}
	}
	covered := map[string]bool{}
	var rules int
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			rules++
			check(r.Alert != "", "only alerting rules are expected, found record %q", r.Record)
			expr, err := promQL.ParseExpr(r.Expr)
			if err != nil {
				check(false, "%s: %v", r.Alert, err)
				continue
			}
			sev := r.Labels["severity"]
			check(sev == "warning" || sev == "critical", "%s: severity %q, want warning or critical", r.Alert, sev)
			check(r.Annotations["summary"] != "" && r.Annotations["description"] != "", "%s needs a summary and a description", r.Alert)
			ms := metricsIn(expr)
			maps.Copy(covered, ms)
			// Thresholds derived from the consumer definition.
			if ms["jetinbox_consumer_ack_pending_messages"] {
				want := 0.9 * float64(js.ledger.MaxAckPending)
				check(slices.Contains(numbersIn(expr), want), "%s: threshold should be 90%% of max_ack_pending (%v), found %v", r.Alert, want, numbersIn(expr))
			}
			if ms["jetinbox_batch_duration_seconds"] {
				want := js.ledger.AckWait.Seconds() / 2
				check(slices.Contains(numbersIn(expr), want), "%s: threshold should be half of ack_wait (%vs), found %v", r.Alert, want, numbersIn(expr))
			}
		}
	}
	for _, m := range []string{"jetinbox_dead_letters_total", "jetinbox_redeliveries_total", "jetinbox_consumer_pending_messages", "jetinbox_consumer_ack_pending_messages", "jetinbox_verify_violations", "jetinbox_conflicts_total"} {
		check(covered[m], "no alert uses %s", m)
	}
	check(rules > 0, "no rules")
	return errors.Join(errs...)
}

func TestAlertRules(t *testing.T) {
	if err := validateAlerts(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}

func validatePrometheusConfig(fsys files) error {
	b, err := fsys.get("prometheus/prometheus.yml")
	if err != nil {
		return err
	}
	cfg, err := promconfig.Load(string(b), slog.New(slog.DiscardHandler))
	if err != nil {
		return fmt.Errorf("prometheus/prometheus.yml: %w", err)
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("prometheus/prometheus.yml: "+format, args...))
		}
	}
	check(slices.Contains(cfg.RuleFiles, "/etc/prometheus/alerts.yml"), "rule_files must load /etc/prometheus/alerts.yml (where compose mounts alerts.yml)")
	jobs := map[string][]string{}
	for _, sc := range cfg.ScrapeConfigs {
		jobs[sc.JobName] = []string{}
		for _, c := range sc.ServiceDiscoveryConfigs {
			if st, ok := c.(discovery.StaticConfig); ok {
				for _, g := range st {
					for _, tg := range g.Targets {
						jobs[sc.JobName] = append(jobs[sc.JobName], string(tg[prommodel.AddressLabel]))
					}
				}
			}
		}
	}
	check(slices.Contains(jobs["jetinbox-consumer"], "consumer:8080"), "job jetinbox-consumer must scrape consumer:8080, has %v", jobs["jetinbox-consumer"])
	// The ConsumerDown alert matches this job name.
	alerts, _ := fsys.get("prometheus/alerts.yml")
	check(bytes.Contains(alerts, []byte(`up{job="jetinbox-consumer"}`)), "alerts.yml's up{} alert does not match the consumer job name")
	return errors.Join(errs...)
}

func TestPrometheusConfig(t *testing.T) {
	if err := validatePrometheusConfig(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}

// dashboard is the subset of Grafana's dashboard JSON model that
// jetinbox-dashboard.json uses, decoded strictly.
type dashboard struct {
	Title         string   `json:"title"`
	UID           string   `json:"uid"`
	Description   string   `json:"description"`
	Tags          []string `json:"tags"`
	Editable      bool     `json:"editable"`
	GraphTooltip  int      `json:"graphTooltip"`
	SchemaVersion int      `json:"schemaVersion"`
	Version       int      `json:"version"`
	Refresh       string   `json:"refresh"`
	Time          struct{ From, To string }
	Timezone      string               `json:"timezone"`
	Links         []any                `json:"links"`
	Annotations   struct{ List []any } `json:"annotations"`
	Templating    struct {
		List []struct {
			Name       string         `json:"name"`
			Label      string         `json:"label"`
			Type       string         `json:"type"`
			Query      any            `json:"query"`
			Datasource *dsRef         `json:"datasource,omitempty"`
			Definition string         `json:"definition,omitempty"`
			IncludeAll bool           `json:"includeAll,omitempty"`
			Multi      bool           `json:"multi,omitempty"`
			AllValue   string         `json:"allValue,omitempty"`
			Current    map[string]any `json:"current"`
			Hide       int            `json:"hide"`
			Refresh    int            `json:"refresh"`
			Sort       int            `json:"sort,omitempty"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int                      `json:"id"`
	Type        string                   `json:"type"`
	Title       string                   `json:"title"`
	Description string                   `json:"description,omitempty"`
	Collapsed   bool                     `json:"collapsed,omitempty"`
	Datasource  *dsRef                   `json:"datasource,omitempty"`
	GridPos     struct{ H, W, X, Y int } `json:"gridPos"`
	Targets     []struct {
		RefID        string `json:"refId"`
		Datasource   *dsRef `json:"datasource,omitempty"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets,omitempty"`
	FieldConfig map[string]any `json:"fieldConfig,omitempty"`
	Options     map[string]any `json:"options,omitempty"`
	Panels      []panel        `json:"panels,omitempty"`
}

// grafanaVars replaces Grafana's macros and variables with what PromQL accepts.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "6h", "$job", ".*")

func validateDashboard(fsys files) error {
	b, err := fsys.get("grafana/jetinbox-dashboard.json")
	if err != nil {
		return err
	}
	var d dashboard
	if err := decodeStrict(b, &d); err != nil {
		return fmt.Errorf("grafana/jetinbox-dashboard.json: %w", err)
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("grafana/jetinbox-dashboard.json: "+format, args...))
		}
	}
	check(d.Title != "" && d.UID != "", "title and uid are required")
	check(d.SchemaVersion >= 36, "schemaVersion %d is older than Grafana 9", d.SchemaVersion)
	ids := map[int]bool{}
	covered := map[string]bool{}
	var byLayer bool
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			check(!ids[p.ID], "panel id %d used twice", p.ID)
			ids[p.ID] = true
			check(p.GridPos.W > 0 && p.GridPos.X+p.GridPos.W <= 24, "panel %q does not fit the 24-column grid", p.Title)
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			check(p.Title != "", "panel %d has no title", p.ID)
			check(len(p.Targets) > 0, "panel %q has no queries", p.Title)
			refs := map[string]bool{}
			for _, t := range p.Targets {
				check(!refs[t.RefID], "panel %q repeats refId %s", p.Title, t.RefID)
				refs[t.RefID] = true
				expr, err := promQL.ParseExpr(grafanaVars.Replace(t.Expr))
				if err != nil {
					check(false, "panel %q: %v", p.Title, err)
					continue
				}
				ms := metricsIn(expr)
				maps.Copy(covered, ms)
				if ms["jetinbox_duplicates_total"] && strings.Contains(t.Expr, "by (layer)") {
					byLayer = true
				}
			}
		}
	}
	walk(d.Panels)
	for _, m := range jetinboxMetrics {
		check(covered[m], "no panel shows %s", m)
	}
	check(byLayer, "no panel shows jetinbox_duplicates_total by (layer)")
	return errors.Join(errs...)
}

func TestGrafanaDashboard(t *testing.T) {
	if err := validateDashboard(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// PostgreSQL settings
// ---------------------------------------------------------------------------

var pgSetting = regexp.MustCompile(`^\s*([a-z_]+)\s*=\s*('(?:[^']|'')*'|[^\s#]+)`)

// pgSettings parses postgresql.conf syntax: name = value, # comments.
func pgSettings(b []byte) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		m := pgSetting.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("line %d: not name = value: %q", i+1, line)
		}
		if _, dup := out[m[1]]; dup {
			return nil, fmt.Errorf("line %d: %s set twice", i+1, m[1])
		}
		out[m[1]] = strings.Trim(m[2], "'")
	}
	return out, nil
}

// pgKnownSettings lists the parameter names the installed PostgreSQL server
// knows (postgres --describe-config needs no cluster and runs as root).
var pgKnownSettings = func() func(t testing.TB) map[string]bool {
	var known map[string]bool
	return func(t testing.TB) map[string]bool {
		t.Helper()
		if known != nil {
			return known
		}
		bin, err := findPostgresBin()
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(filepath.Join(bin, "postgres"), "--describe-config").Output()
		if err != nil {
			t.Fatalf("postgres --describe-config: %v", err)
		}
		known = map[string]bool{}
		for _, line := range strings.Split(string(out), "\n") {
			if name, _, ok := strings.Cut(line, "\t"); ok {
				known[name] = true
			}
		}
		return known
	}
}()

func validatePostgresConf(fsys files, known map[string]bool) error {
	b, err := fsys.get("postgres/postgresql.conf.snippet")
	if err != nil {
		return err
	}
	s, err := pgSettings(b)
	if err != nil {
		return fmt.Errorf("postgres/postgresql.conf.snippet: %w", err)
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("postgres/postgresql.conf.snippet: "+format, args...))
		}
	}
	for name := range s {
		check(known[name], "%s is not a PostgreSQL setting", name)
	}
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes", "ssl"} {
		check(s[name] == "on", "%s = %q, want on", name, s[name])
	}
	for _, name := range []string{"lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"} {
		check(s[name] != "" && s[name] != "0", "%s must be set to a non-zero timeout", name)
	}
	// Documented (commented: a standby name that does not exist would block
	// every commit), with its reason.
	check(regexp.MustCompile(`(?m)^#\s*synchronous_standby_names\s*=`).Match(b), "synchronous_standby_names example missing")
	check(bytes.Contains(b, []byte("async")) && bytes.Contains(b, []byte("acked")), "the reason for a synchronous standby is missing")
	check(bytes.Contains(b, []byte("verify-full")), "the sslmode=verify-full note for clients is missing")
	return errors.Join(errs...)
}

func TestPostgresConf(t *testing.T) {
	if err := validatePostgresConf(loadFiles(t), pgKnownSettings(t)); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// Mutations: each validator must reject a broken copy of its file.
// ---------------------------------------------------------------------------

func TestMutationsAreRejected(t *testing.T) {
	fsys := loadFiles(t)
	fx := fixture(t)
	tlsDir := filepath.Join(fx.dir, "tls")
	nats := func(f files) error { return validateNATS(f, t.TempDir(), tlsDir) }
	compose := func(f files) error { return validateCompose(f, fx) }
	helm := func(f files) error { return validateHelmValues(f, tlsDir) }
	pgconf := func(f files) error { return validatePostgresConf(f, pgKnownSettings(t)) }

	tests := []struct {
		name          string
		file, old, nu string
		validate      func(files) error
	}{
		// NATS: the server's parser rejects an unknown key; our checks reject
		// a parsable but unsafe value.
		{"nats key typo", "nats/common.conf", "sync_interval: always", "sync_intervall: always", nats},
		{"nats default sync", "nats/common.conf", "sync_interval: always", "sync_interval: 2m", nats},
		{"nats route typo", "nats/nats-2.conf", "nats-route://nats-3:6222", "nats-route://nats-4:6222", nats},
		{"nats routes key typo", "nats/nats-1.conf", "routes: [", "route: [", nats},
		{"nats permission widened", "nats/auth.conf", `"intents.>",`, `"intents.>", "dlq.intents.>",`, nats},
		{"nats consumer permission typo", "nats/auth.conf", `"$JS.API.CONSUMER.MSG.NEXT.INTENTS.ledger"`, `"$JS.API.CONSUMER.MSG.NEXT.INTENTS.ledgr"`, nats},
		{"nats bad public key", "nats/auth.conf", `UAQLRUVIJSGQ5VXZOBPCQCCR5M256I7PZXZYQXBTFGMRA55WWBK7YM7M`, `UAQLRUVIJSGQ5VXZOBPCQCCR5M256I7PZXZYQXBTFGMRA55WWBK7YM7N`, nats},
		{"nats tls verify off", "nats/common.conf", "  verify: true", "  verify: false", nats},
		{"nats consumer cannot drain advisories", "nats/auth.conf", `      "$JS.API.CONSUMER.MSG.NEXT.INTENTS_ADVISORIES.ledger",` + "\n", "", nats},
		{"nats consumer acks other advisories", "nats/auth.conf", `"$JS.ACK.INTENTS_ADVISORIES.ledger.>"`, `"$JS.ACK.INTENTS_ADVISORIES.>"`, nats},
		{"nats producer cannot check streams", "nats/auth.conf", `      "$JS.API.STREAM.INFO.INTENTS_DLQ",` + "\n", "", nats},
		{"nats advisories on core nats", "nats/auth.conf", `allow: ["_INBOX.>"]`, `allow: ["_INBOX.>", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.INTENTS.ledger"]`, nats},

		{"stream unknown field", "jetstream/intents-stream.json", `"deny_delete"`, `"deny_delet"`, validateJetStream},
		{"stream discard old", "jetstream/intents-stream.json", `"discard": "new"`, `"discard": "old"`, validateJetStream},
		{"stream replicas", "jetstream/dlq-stream.json", `"num_replicas": 3`, `"num_replicas": 1`, validateJetStream},
		{"stream memory", "jetstream/intents-stream.json", `"storage": "file"`, `"storage": "memory"`, validateJetStream},
		{"consumer infinite deliveries", "jetstream/ledger-consumer.json", `"max_deliver": 20`, `"max_deliver": -1`, validateJetStream},
		{"consumer ack none", "jetstream/ledger-consumer.json", `"ack_policy": "explicit"`, `"ack_policy": "none"`, validateJetStream},
		{"advisories subject typo", "jetstream/advisories-stream.json", `MAX_DELIVERIES.INTENTS.*`, `MAX_DELIVERY.INTENTS.*`, validateJetStream},
		{"advisories kept shorter", "jetstream/advisories-stream.json", `"max_age": 604800000000000`, `"max_age": 86400000000000`, validateJetStream},
		{"advisories deletable", "jetstream/advisories-stream.json", `"deny_delete": true`, `"deny_delete": false`, validateJetStream},
		{"advisories memory", "jetstream/advisories-stream.json", `"storage": "file"`, `"storage": "memory"`, validateJetStream},
		{"advisories replicas", "jetstream/advisories-stream.json", `"num_replicas": 3`, `"num_replicas": 1`, validateJetStream},
		{"rescue every durable", "jetstream/ledger-rescue-consumer.json", `MAX_DELIVERIES.INTENTS.ledger"`, `MAX_DELIVERIES.INTENTS.*"`, validateJetStream},
		{"rescue gives up", "jetstream/ledger-rescue-consumer.json", `"max_deliver": -1`, `"max_deliver": 20`, validateJetStream},
		{"rescue ack wait", "jetstream/ledger-rescue-consumer.json", `"ack_wait": 30000000000`, `"ack_wait": 5000000000`, validateJetStream},
		{"rescue other name", "jetstream/ledger-rescue-consumer.json", `"durable_name": "ledger"`, `"durable_name": "ledger-rescue"`, validateJetStream},

		{"compose key typo", "compose.yaml", "    environment:\n      <<: *nats-env\n      NATS_NKEY: /run/secrets/consumer_nkey", "    enviroment:\n      <<: *nats-env\n      NATS_NKEY: /run/secrets/consumer_nkey", compose},
		{"compose missing NATS_URL", "compose.yaml", "  NATS_URL: tls://nats-1:4222,tls://nats-2:4222,tls://nats-3:4222\n", "", compose},
		{"compose old nats", "compose.yaml", "image: nats:2.15.2-alpine", "image: nats:2.12.1-alpine", compose},
		{"compose path typo", "compose.yaml", "./nats/nats-2.conf:", "./nats/nats2.conf:", compose},
		{"compose secret typo", "compose.yaml", "file: ./secrets/nkeys/consumer.nk", "file: ./secrets/nkeys/consumer.key", compose},
		{"compose interpolation typo", "compose.yaml", "${JETINBOX_IMAGE:-jetinbox:dev}", "${JETINBOX_IMAGE:-jetinbox:dev", compose},
		{"compose short grace", "compose.yaml", "    stop_grace_period: 45s\n    depends_on:\n      nats-setup", "    stop_grace_period: 10s\n    depends_on:\n      nats-setup", compose},
		{"compose durable mismatch", "compose.yaml", "JETINBOX_DURABLE: ledger", "JETINBOX_DURABLE: ledgr", compose},
		{"compose advisories after intents", "compose.yaml",
			"        nats stream info INTENTS_ADVISORIES >/dev/null 2>&1 || nats stream add INTENTS_ADVISORIES --config /jetstream/advisories-stream.json\n" +
				"        nats consumer info INTENTS_ADVISORIES ledger >/dev/null 2>&1 || nats consumer add INTENTS_ADVISORIES ledger --config /jetstream/ledger-rescue-consumer.json\n" +
				"        nats stream info INTENTS >/dev/null 2>&1 || nats stream add INTENTS --config /jetstream/intents-stream.json\n",
			"        nats stream info INTENTS >/dev/null 2>&1 || nats stream add INTENTS --config /jetstream/intents-stream.json\n" +
				"        nats stream info INTENTS_ADVISORIES >/dev/null 2>&1 || nats stream add INTENTS_ADVISORIES --config /jetstream/advisories-stream.json\n" +
				"        nats consumer info INTENTS_ADVISORIES ledger >/dev/null 2>&1 || nats consumer add INTENTS_ADVISORIES ledger --config /jetstream/ledger-rescue-consumer.json\n", compose},
		{"compose rescue consumer on intents", "compose.yaml", "nats consumer add INTENTS_ADVISORIES ledger --config /jetstream/ledger-rescue-consumer.json",
			"nats consumer add INTENTS ledger --config /jetstream/ledger-rescue-consumer.json", compose},
		{"compose unattached secret", "compose.yaml", "secrets: [ca, consumer_nkey, consumer_cert, consumer_key, jetinbox_consumer_pgpass]", "secrets: [ca, consumer_nkey, consumer_cert, consumer_key]", compose},

		{"readme advisories after intents", "README.md", readmeAdvisories + readmeRescue + readmeIntents, readmeIntents + readmeAdvisories + readmeRescue, validateReadme},
		{"readme rescue consumer missing", "README.md", "< deploy/jetstream/ledger-rescue-consumer.json\n", "\n", validateReadme},

		{"dockerfile missing binary", "Dockerfile", "/out/producer /out/jetinbox", "/out/producer", validateDockerfile},

		{"deployment field typo", "kubernetes/consumer-deployment.yaml", "readinessProbe:", "readynessProbe:", validateK8s},
		{"deployment short grace", "kubernetes/consumer-deployment.yaml", "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 20", validateK8s},
		{"deployment wrong probe path", "kubernetes/consumer-deployment.yaml", "path: /readyz", "path: /ready", validateK8s},
		{"deployment writable root", "kubernetes/consumer-deployment.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", validateK8s},
		{"deployment unknown secret key", "kubernetes/consumer-deployment.yaml", "value: /etc/jetinbox/nats/nkey", "value: /etc/jetinbox/nats/seed", validateK8s},
		{"pdb selector typo", "kubernetes/consumer-pdb.yaml", "      app.kubernetes.io/component: consumer", "      app.kubernetes.io/component: consumr", validateK8s},
		{"job field typo", "kubernetes/migrate-job.yaml", "backoffLimit: 4", "backofLimit: 4", validateK8s},
		{"secret value committed", "kubernetes/secrets.template.yaml", `nkey: ""`, `nkey: "SUAEXAMPLE"`, validateK8s},

		{"helm key typo", "kubernetes/nats-values.yaml", "  jetstream:\n    enabled: true", "  jetstrem:\n    enabled: true", helm},
		{"helm sync default", "kubernetes/nats-values.yaml", "sync_interval: always", "sync_interval: 2m", helm},
		{"helm bad merge key", "kubernetes/nats-values.yaml", "verify_cert_and_check_known_urls: true", "verify_cert_and_check_known_url: true", helm},
		{"helm include path", "kubernetes/nats-values.yaml", "zz$include: ../nats-auth/auth.conf", "zz$include: ./nats-auth/auth.conf", helm},

		{"alerts key typo", "prometheus/alerts.yml", "expr: max by (job) (jetinbox_verify_violations) > 0", "exp: max by (job) (jetinbox_verify_violations) > 0", validateAlerts},
		{"alerts promql typo", "prometheus/alerts.yml", "sum by (job) (increase(jetinbox_dead_letters_total[15m])) > 0", "sum by (job) (increse(jetinbox_dead_letters_total[15m])) > 0", validateAlerts},
		{"alerts stale threshold", "prometheus/alerts.yml", "(jetinbox_consumer_ack_pending_messages) > 3600", "(jetinbox_consumer_ack_pending_messages) > 900", validateAlerts},
		{"alerts metric typo", "prometheus/alerts.yml", "increase(jetinbox_conflicts_total[15m])", "increase(jetinbox_conflict_total[15m])", validateAlerts},
		{"prometheus key typo", "prometheus/prometheus.yml", "scrape_configs:", "scrape_config:", validatePrometheusConfig},
		{"prometheus target", "prometheus/prometheus.yml", `"consumer:8080"`, `"consumer:9090"`, validatePrometheusConfig},

		{"dashboard key typo", "grafana/jetinbox-dashboard.json", `"targets"`, `"target"`, validateDashboard},
		{"dashboard promql typo", "grafana/jetinbox-dashboard.json", `histogram_quantile(0.99, sum by (le) (rate(jetinbox_publish_to_commit_seconds_bucket`, `histogram_quantile(0.99, sum by (le) (rate(jetinbox_publish_to_commit_seconds_bucket[`, validateDashboard},

		{"pg setting typo", "postgres/postgresql.conf.snippet", "idle_in_transaction_session_timeout = '60s'", "idle_in_transaction_timeout = '60s'", pgconf},
		{"pg fsync off", "postgres/postgresql.conf.snippet", "fsync = on", "fsync = off", pgconf},
	}
	// A mutation only proves something if the unmutated files pass.
	baseline := map[string]error{}
	for _, tt := range tests {
		if _, done := baseline[tt.file]; !done {
			baseline[tt.file] = tt.validate(fsys)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := baseline[tt.file]; err != nil {
				t.Fatalf("the unmutated files fail already: %v", err)
			}
			err := tt.validate(fsys.with(t, tt.file, tt.old, tt.nu))
			if err == nil {
				t.Fatalf("%s with %q -> %q was accepted", tt.file, tt.old, tt.nu)
			}
			t.Logf("rejected: %v", firstLine(err.Error()))
		})
	}
}

// The Kubernetes steps' stream and consumer lines, for mutations.
const (
	readmeAdvisories = "kubectl -n nats exec -i deploy/nats-box -- nats stream add INTENTS_ADVISORIES --config /dev/stdin < deploy/jetstream/advisories-stream.json\n"
	readmeRescue     = "kubectl -n nats exec -i deploy/nats-box -- nats consumer add INTENTS_ADVISORIES ledger --config /dev/stdin < deploy/jetstream/ledger-rescue-consumer.json\n"
	readmeIntents    = "kubectl -n nats exec -i deploy/nats-box -- nats stream add INTENTS --config /dev/stdin < deploy/jetstream/intents-stream.json\n"
)

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
