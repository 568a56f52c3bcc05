package deploy_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

var natsNodes = []string{"nats-1", "nats-2", "nats-3"}

// Permissions the configs must grant, exactly: a change here is a change of
// the security policy and must be deliberate. TestProjectUnderShippedRoles
// runs jetinbox's own producer and consumer under them and checks that they
// use each of these (but $JS.API.INFO) and are refused nothing;
// TestShardsUnderShippedRoles does the same with the binaries on the
// partitioned stream for the *ShardPublish lists.
var (
	producerPublish = []string{
		"intents.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.INTENTS", "$JS.API.STREAM.MSG.GET.INTENTS",
		// jsinbox.EnsureStream, which the producer runs at start, looks up
		// the dead-letter and advisory streams too.
		"$JS.API.STREAM.INFO.INTENTS_DLQ", "$JS.API.STREAM.INFO.INTENTS_ADVISORIES",
	}
	// producer -shards: the partitioned stream, on pintents.<key>.<kind>
	// (the transform inserts the partition), the same start checks and
	// read-back.
	producerShardPublish = []string{
		"pintents.*.>", "$JS.API.STREAM.INFO.PINTENTS", "$JS.API.STREAM.INFO.PINTENTS_DLQ",
		"$JS.API.STREAM.INFO.PINTENTS_ADVISORIES", "$JS.API.STREAM.MSG.GET.PINTENTS",
	}
	consumerPublish = []string{
		"$JS.API.INFO", "$JS.API.STREAM.INFO.INTENTS", "$JS.API.CONSUMER.INFO.INTENTS.ledger", "$JS.API.CONSUMER.MSG.NEXT.INTENTS.ledger",
		// At start: does the largest intent fit the dead-letter stream?
		"$JS.API.STREAM.INFO.INTENTS_DLQ",
		"$JS.ACK.INTENTS.ledger.>", "dlq.intents.>",
		// The ledger durable's max-deliveries advisories, drained from the
		// stream that keeps them: messages the server gave up on are read
		// back (a direct get: INTENTS allows them) and rescued.
		"$JS.API.DIRECT.GET.INTENTS",
		"$JS.API.STREAM.INFO.INTENTS_ADVISORIES", "$JS.API.CONSUMER.INFO.INTENTS_ADVISORIES.ledger",
		"$JS.API.CONSUMER.MSG.NEXT.INTENTS_ADVISORIES.ledger", "$JS.ACK.INTENTS_ADVISORIES.ledger.>",
	}
	// consumer -shards: the same on the partitioned stream, for every
	// partition durable (and rescue durable) the admin made.
	consumerShardPublish = []string{
		"$JS.API.STREAM.INFO.PINTENTS", "$JS.API.STREAM.INFO.PINTENTS_DLQ", "$JS.API.STREAM.INFO.PINTENTS_ADVISORIES",
		"$JS.API.CONSUMER.INFO.PINTENTS.*", "$JS.API.CONSUMER.MSG.NEXT.PINTENTS.*", "$JS.ACK.PINTENTS.*.>",
		"$JS.API.CONSUMER.INFO.PINTENTS_ADVISORIES.*", "$JS.API.CONSUMER.MSG.NEXT.PINTENTS_ADVISORIES.*", "$JS.ACK.PINTENTS_ADVISORIES.*.>",
		"$JS.API.DIRECT.GET.PINTENTS", "dlq.pintents.>",
	}
	// jetinbox verify -watch: direct gets on INTENTS and INTENTS_DLQ, the
	// ledger durable's and the rescue consumer's info, and the advisories
	// the rescue has not settled (direct gets on INTENTS_ADVISORIES). No
	// consumer of its own, no ack, no publish, no delete.
	verifyPublish = []string{
		"$JS.API.INFO", "$JS.API.STREAM.INFO.INTENTS", "$JS.API.STREAM.INFO.INTENTS_DLQ",
		"$JS.API.CONSUMER.INFO.INTENTS.ledger", "$JS.API.CONSUMER.INFO.INTENTS_ADVISORIES.ledger",
		"$JS.API.DIRECT.GET.INTENTS", "$JS.API.DIRECT.GET.INTENTS_DLQ",
		"$JS.API.STREAM.INFO.INTENTS_ADVISORIES", "$JS.API.DIRECT.GET.INTENTS_ADVISORIES",
	}
	// verify -shards: the partitioned stream and its dead letters, every
	// partition's rescue durable and the advisories it has not settled.
	verifyShardPublish = []string{
		"$JS.API.STREAM.INFO.PINTENTS", "$JS.API.STREAM.INFO.PINTENTS_DLQ",
		"$JS.API.DIRECT.GET.PINTENTS", "$JS.API.DIRECT.GET.PINTENTS_DLQ",
		"$JS.API.STREAM.INFO.PINTENTS_ADVISORIES", "$JS.API.CONSUMER.INFO.PINTENTS_ADVISORIES.*", "$JS.API.DIRECT.GET.PINTENTS_ADVISORIES",
	}
	// jetinbox relay: the outbox's rows into NOTIFICATIONS, pinned there;
	// the stream looked up at start, a duplicate's stored copy read back.
	relayPublish = []string{
		"notifications.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.NOTIFICATIONS", "$JS.API.STREAM.MSG.GET.NOTIFICATIONS",
	}
	// Each role's reply-subject prefix: it may subscribe under it and
	// nowhere else, so no role reads another's replies (the consumer's
	// pulled intents arrive on its reply subjects). The shipped compose and
	// Kubernetes files give each client its role's prefix.
	inboxPrefix = map[string]string{"producer": "_INBOX_producer", "consumer": "_INBOX_consumer", "relay": "_INBOX_relay", "verify": "_INBOX_verify"}
	// Each role's account. The streams are in JETINBOX; the producer, the
	// relay and the verifier call it through service imports of exactly
	// their publish permissions, so the server replaces their reply
	// subjects (which NATS never checks against permissions) with its own
	// before a request reaches a stream's account.
	roleAccount = map[string]string{"producer": "PRODUCER", "consumer": "JETINBOX", "relay": "RELAY", "verify": "VERIFY"}
	// Each role's permissions: the plain stream's and the partitioned
	// stream's (deploy/sharding) together.
	rolePublish = map[string][]string{
		"producer": slices.Concat(producerPublish, producerShardPublish),
		"consumer": slices.Concat(consumerPublish, consumerShardPublish),
		"relay":    relayPublish,
		"verify":   slices.Concat(verifyPublish, verifyShardPublish),
	}
)

// roleSubscribe is what role may subscribe to: its own replies.
func roleSubscribe(role string) []string { return []string{inboxPrefix[role] + ".>"} }

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
	// Room for the largest dead letter (an intent of jetinbox's default
	// max_msg_size plus the dead-letter headers) and little more.
	check(opts.MaxPayload >= jsinbox.DefaultMaxMsgSize+jsinbox.DeadLetterHeadroom && opts.MaxPayload <= 64<<10,
		"max_payload %d, want room for a dead letter (%d) and at most 64KB", opts.MaxPayload, jsinbox.DefaultMaxMsgSize+jsinbox.DeadLetterHeadroom)
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
	check(len(opts.Nkeys) == 6, "%d nkey users, want producer, consumer, relay, verify, admin, sys", len(opts.Nkeys))
	var producer, consumer, relay, verifier int
	for _, u := range opts.Nkeys {
		acc := ""
		if u.Account != nil {
			acc = u.Account.Name
		}
		if u.Permissions == nil {
			check(acc == "JETINBOX" || acc == "SYS", "user %s without permissions in account %q", u.Nkey, acc)
			continue
		}
		p := u.Permissions
		check(p.Publish != nil && p.Subscribe != nil, "user %s lacks publish or subscribe permissions", u.Nkey)
		if p.Publish == nil || p.Subscribe == nil {
			continue
		}
		check(len(p.Publish.Deny) == 0 && len(p.Subscribe.Deny) == 0, "user %s: use allow lists only", u.Nkey)
		role := ""
		switch {
		case slices.Contains(p.Publish.Allow, "intents.>"):
			producer++
			role = "producer"
			check(sameSet(p.Publish.Allow, rolePublish[role]), "producer may publish to %v, want %v", p.Publish.Allow, rolePublish[role])
		case slices.Contains(p.Publish.Allow, "dlq.intents.>"):
			consumer++
			role = "consumer"
			check(sameSet(p.Publish.Allow, rolePublish[role]), "consumer may publish to %v, want %v", p.Publish.Allow, rolePublish[role])
		case slices.Contains(p.Publish.Allow, "notifications.>"):
			relay++
			role = "relay"
			check(sameSet(p.Publish.Allow, relayPublish), "relay may publish to %v, want %v", p.Publish.Allow, relayPublish)
		case slices.Contains(p.Publish.Allow, "$JS.API.DIRECT.GET.INTENTS_DLQ"):
			verifier++
			role = "verify"
			check(sameSet(p.Publish.Allow, rolePublish[role]), "verify may publish to %v, want %v", p.Publish.Allow, rolePublish[role])
		default:
			check(false, "user %s has permissions that are none of the producer's, the consumer's, the relay's or the verifier's: %v", u.Nkey, p.Publish.Allow)
		}
		if role != "" {
			check(sameSet(p.Subscribe.Allow, roleSubscribe(role)), "%s may subscribe to %v, want its own replies only: %v", role, p.Subscribe.Allow, roleSubscribe(role))
			check(acc == roleAccount[role], "the %s user is in account %q, want %s", role, acc, roleAccount[role])
		}
	}
	check(producer == 1 && consumer == 1 && relay == 1 && verifier == 1, "found %d producer, %d consumer, %d relay and %d verify users, want one each", producer, consumer, relay, verifier)
	if err := checkAccounts(path); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", node, err))
	}
	return opts, errors.Join(errs...)
}

// checkAccounts reads the accounts of a node config (with the server's
// config parser, includes and variables resolved) and checks the exports
// and imports: JETINBOX holds the streams and exports each subject a role
// outside it publishes to, as a service, to exactly the accounts of the
// roles that use it; each of those accounts imports exactly its role's
// publish permissions from JETINBOX, under the same subject, and has no
// JetStream of its own. Nothing else is exported or imported.
func checkAccounts(path string) error {
	m, err := conf.ParseFile(path)
	if err != nil {
		return err
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	accounts, _ := m["accounts"].(map[string]any)
	// What the accounts should be, from the role lists.
	wantExports := map[string][]string{} // subject -> importing accounts
	wantAccounts := []string{"JETINBOX", "SYS"}
	for role, acc := range roleAccount {
		if acc == "JETINBOX" {
			continue
		}
		wantAccounts = append(wantAccounts, acc)
		for _, subj := range rolePublish[role] {
			wantExports[subj] = append(wantExports[subj], acc)
		}
	}
	var names []string
	for name := range accounts {
		names = append(names, name)
	}
	check(sameSet(names, wantAccounts), "accounts %v, want %v", names, wantAccounts)

	jet, _ := accounts["JETINBOX"].(map[string]any)
	_, hasImports := jet["imports"]
	check(!hasImports, "JETINBOX imports something: %v", jet["imports"])
	gotExports := map[string]bool{}
	for _, e := range asList(jet["exports"]) {
		em, _ := e.(map[string]any)
		subj, _ := em["service"].(string)
		check(subj != "", "JETINBOX exports something other than a service: %v", e)
		if subj == "" {
			continue
		}
		check(!gotExports[subj], "JETINBOX exports %s twice", subj)
		gotExports[subj] = true
		want, ok := wantExports[subj]
		check(ok, "JETINBOX exports %s, which no role outside it publishes to", subj)
		var to []string
		for _, a := range asList(em["accounts"]) {
			s, _ := a.(string)
			to = append(to, s)
		}
		check(ok && sameSet(to, want), "JETINBOX exports %s to %v, want exactly %v", subj, to, want)
		// A direct get with a batch answers with many messages; everything
		// else with one.
		rt, _ := em["response_type"].(string)
		wantRT := ""
		if strings.Contains(subj, ".DIRECT.GET.") {
			wantRT = "stream"
		}
		check(rt == wantRT, "JETINBOX exports %s with response_type %q, want %q", subj, rt, wantRT)
		for k := range em {
			check(k == "service" || k == "accounts" || k == "response_type", "JETINBOX's export of %s sets %s", subj, k)
		}
	}
	for subj := range wantExports {
		check(gotExports[subj], "JETINBOX does not export %s", subj)
	}
	for role, acc := range roleAccount {
		if acc == "JETINBOX" {
			continue
		}
		am, _ := accounts[acc].(map[string]any)
		_, js := am["jetstream"]
		_, exports := am["exports"]
		check(!js && !exports, "account %s has JetStream or exports of its own", acc)
		var imported []string
		for _, i := range asList(am["imports"]) {
			im, _ := i.(map[string]any)
			svc, _ := im["service"].(map[string]any)
			from, _ := svc["account"].(string)
			subj, _ := svc["subject"].(string)
			check(len(im) == 1 && svc != nil && from == "JETINBOX" && len(svc) == 2, "account %s imports %v, want services of JETINBOX under their own subject", acc, i)
			imported = append(imported, subj)
		}
		check(sameSet(imported, rolePublish[role]), "account %s imports %v, want its %s role's publish permissions %v", acc, imported, role, rolePublish[role])
	}
	return errors.Join(errs...)
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
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
