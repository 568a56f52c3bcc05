package deploy_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestMutationsAreRejected: each validator must reject a broken copy of its
// file.
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
		{"nats advisories on core nats", "nats/auth.conf", `allow: ["_INBOX_consumer.>"]`, `allow: ["_INBOX_consumer.>", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.INTENTS.ledger"]`, nats},
		{"nats producer reads every inbox", "nats/auth.conf", `allow: ["_INBOX_producer.>"]`, `allow: ["_INBOX.>"]`, nats},
		{"compose consumer on the shared inbox", "compose.yaml", "NATS_INBOX_PREFIX: _INBOX_consumer", "NATS_INBOX_PREFIX: _INBOX", compose},

		{"nats max_payload back to 1MB", "nats/common.conf", "max_payload: 16KB", "max_payload: 1MB", nats},
		{"stream takes 1MiB intents", "jetstream/intents-stream.json", `"max_msg_size": 8192`, `"max_msg_size": 1048576`, validateJetStream},
		{"dead letters smaller than intents", "jetstream/dlq-stream.json", `"max_msg_size": 12288`, `"max_msg_size": 8192`, validateJetStream},
		{"policy lets every source in", "kubernetes/networkpolicy.yaml", "  ingress:\n    - from:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring\n          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: prometheus\n      ports:", "  ingress:\n    - ports:", validateK8s},
		{"policy lets the consumer out anywhere", "kubernetes/networkpolicy.yaml", "        - port: 5432\n          protocol: TCP", "        - port: 443\n          protocol: TCP", validateK8s},
		{"policy egress only", "kubernetes/networkpolicy.yaml", "policyTypes: [Ingress, Egress]", "policyTypes: [Egress]", validateK8s},
		{"stream unknown field", "jetstream/intents-stream.json", `"deny_delete"`, `"deny_delet"`, validateJetStream},
		{"stream discard old", "jetstream/intents-stream.json", `"discard": "new"`, `"discard": "old"`, validateJetStream},
		{"notifications purgeable", "jetstream/notifications-stream.json", `"deny_purge": true`, `"deny_purge": false`, validateJetStream},
		{"notifications take 1MiB", "jetstream/notifications-stream.json", `"max_msg_size": 8192`, `"max_msg_size": 1048576`, validateJetStream},
		{"stream replicas", "jetstream/dlq-stream.json", `"num_replicas": 3`, `"num_replicas": 1`, validateJetStream},
		{"stream memory", "jetstream/intents-stream.json", `"storage": "file"`, `"storage": "memory"`, validateJetStream},
		{"consumer infinite deliveries", "jetstream/ledger-consumer.json", `"max_deliver": 20`, `"max_deliver": -1`, validateJetStream},
		{"consumer ack none", "jetstream/ledger-consumer.json", `"ack_policy": "explicit"`, `"ack_policy": "none"`, validateJetStream},
		{"advisories subject typo", "jetstream/advisories-stream.json", `MAX_DELIVERIES.INTENTS.*`, `MAX_DELIVERY.INTENTS.*`, validateJetStream},
		{"advisories kept shorter", "jetstream/advisories-stream.json", `"max_age": 3196800000000000`, `"max_age": 86400000000000`, validateJetStream},
		{"advisories deletable", "jetstream/advisories-stream.json", `"deny_delete": true`, `"deny_delete": false`, validateJetStream},
		{"advisories memory", "jetstream/advisories-stream.json", `"storage": "file"`, `"storage": "memory"`, validateJetStream},
		{"advisories replicas", "jetstream/advisories-stream.json", `"num_replicas": 3`, `"num_replicas": 1`, validateJetStream},
		{"rescue every durable", "jetstream/ledger-rescue-consumer.json", `MAX_DELIVERIES.INTENTS.ledger"`, `MAX_DELIVERIES.INTENTS.*"`, validateJetStream},
		{"rescue gives up", "jetstream/ledger-rescue-consumer.json", `"max_deliver": -1`, `"max_deliver": 20`, validateJetStream},
		{"rescue ack wait", "jetstream/ledger-rescue-consumer.json", `"ack_wait": 30000000000`, `"ack_wait": 5000000000`, validateJetStream},
		{"rescue other name", "jetstream/ledger-rescue-consumer.json", `"durable_name": "ledger"`, `"durable_name": "ledger-rescue"`, validateJetStream},

		{"compose key typo", "compose.yaml", "    environment:\n      <<: *nats-env\n      NATS_CA: /run/jetinbox/ca\n      NATS_NKEY: /run/jetinbox/consumer_nkey", "    enviroment:\n      <<: *nats-env\n      NATS_CA: /run/jetinbox/ca\n      NATS_NKEY: /run/jetinbox/consumer_nkey", compose},
		{"compose missing NATS_URL", "compose.yaml", "  NATS_URL: tls://nats-1:4222,tls://nats-2:4222,tls://nats-3:4222\n", "", compose},
		{"compose old nats", "compose.yaml", "image: nats:2.15.0-alpine@sha256:004796a89b7ad925027a01d69d175734403f5b3b98d49f4ed2c861e6f9aafec4", "image: nats:2.12.1-alpine", compose},
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
		{"compose unattached secret", "compose.yaml", "secrets: [ca, admin_nkey, admin_cert, admin_key]", "secrets: [admin_nkey, admin_cert, admin_key]", compose},
		{"compose secret not copied", "compose.yaml", "copy consumer ca consumer_nkey consumer_cert consumer_key jetinbox_consumer_pgpass", "copy consumer ca consumer_nkey consumer_cert consumer_key", compose},
		{"compose secret bind-mounted into a non-root service", "compose.yaml", "      - consumer-secrets:/run/jetinbox:ro\n", "      - consumer-secrets:/run/jetinbox:ro\n    secrets: [jetinbox_consumer_pgpass]\n", compose},
		{"kubernetes verify as consumer", "kubernetes/verify-deployment.yaml", "secretName: jetinbox-verifier-db", "secretName: jetinbox-consumer-db", validateK8s},
		{"kubernetes relay as consumer", "kubernetes/relay-deployment.yaml", "postgres://jetinbox_relay@", "postgres://jetinbox_consumer@", validateK8s},
		{"kubernetes relay into intents", "kubernetes/relay-deployment.yaml", "value: NOTIFICATIONS", "value: INTENTS", validateK8s},
		{"kubernetes relay writable root", "kubernetes/relay-deployment.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", validateK8s},
		{"nats producer back in the streams' account", "nats/auth.conf", "      {nkey: $CONSUMER_NKEY, permissions: $CONSUMER_PERMISSIONS}\n", "      {nkey: $CONSUMER_NKEY, permissions: $CONSUMER_PERMISSIONS}\n      {nkey: $PRODUCER_NKEY, permissions: $PRODUCER_PERMISSIONS}\n", nats},
		{"nats intents exported to every account", "nats/auth.conf", `{service: "intents.>", accounts: [PRODUCER]}`, `{service: "intents.>"}`, nats},
		{"nats intents exported to the verifier", "nats/auth.conf", `{service: "intents.>", accounts: [PRODUCER]}`, `{service: "intents.>", accounts: [PRODUCER, VERIFY]}`, nats},
		{"nats verifier imports consumer creation", "nats/auth.conf", `      {service: {account: JETINBOX, subject: "$JS.API.DIRECT.GET.INTENTS_DLQ"}}` + "\n", `      {service: {account: JETINBOX, subject: "$JS.API.DIRECT.GET.INTENTS_DLQ"}}` + "\n" + `      {service: {account: JETINBOX, subject: "$JS.API.CONSUMER.CREATE.INTENTS.*"}}` + "\n", nats},
		{"nats verifier may create consumers", "nats/auth.conf", `      "$JS.API.DIRECT.GET.INTENTS_DLQ",` + "\n", `      "$JS.API.DIRECT.GET.INTENTS_DLQ",` + "\n" + `      "$JS.API.CONSUMER.CREATE.INTENTS.*",` + "\n", nats},
		// The partitioned stream's permissions.
		{"nats producer publishes partitioned dead letters", "nats/auth.conf", `      "pintents.*.>",`, `      "pintents.*.>", "dlq.pintents.>",`, nats},
		{"nats producer publishes advisories of partitions", "nats/auth.conf", `      "pintents.*.>",`, `      "pintents.*.>", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.PINTENTS.*",`, nats},
		{"nats consumer creates partition durables", "nats/auth.conf", `      "$JS.API.CONSUMER.INFO.PINTENTS.*",`, `      "$JS.API.CONSUMER.INFO.PINTENTS.*", "$JS.API.CONSUMER.CREATE.PINTENTS.*",`, nats},
		{"nats consumer pulls any stream's consumers", "nats/auth.conf", `"$JS.API.CONSUMER.MSG.NEXT.PINTENTS.*"`, `"$JS.API.CONSUMER.MSG.NEXT.*.*"`, nats},
		{"nats consumer publishes partitioned intents", "nats/auth.conf", `      "dlq.pintents.>"` + "\n", `      "dlq.pintents.>", "pintents.*.>"` + "\n", nats},
		{"nats partitioned intents exported to every account", "nats/auth.conf", `{service: "pintents.*.>", accounts: [PRODUCER]}`, `{service: "pintents.*.>"}`, nats},
		{"nats verifier's partitioned direct gets cut to one reply", "nats/auth.conf", `{service: "$JS.API.DIRECT.GET.PINTENTS", accounts: [VERIFY], response_type: stream}`, `{service: "$JS.API.DIRECT.GET.PINTENTS", accounts: [VERIFY]}`, nats},
		{"nats verifier cannot read partitioned dead letters", "nats/auth.conf", `      "$JS.API.DIRECT.GET.PINTENTS_DLQ",` + "\n", "", nats},
		{"nats producer's import renamed", "nats/auth.conf", `{service: {account: JETINBOX, subject: "intents.>"}}`, `{service: {account: JETINBOX, subject: "intents.>"}, to: "mine.>"}`, nats},
		{"nats direct batch cut to one reply", "nats/auth.conf", `{service: "$JS.API.DIRECT.GET.INTENTS", accounts: [VERIFY], response_type: stream}`, `{service: "$JS.API.DIRECT.GET.INTENTS", accounts: [VERIFY]}`, nats},
		{"nats producer account with jetstream", "nats/auth.conf", "  PRODUCER {\n", "  PRODUCER {\n    jetstream: enabled\n", nats},
		{"intents without direct gets", "jetstream/intents-stream.json", `"allow_direct": true`, `"allow_direct": false`, validateJetStream},
		{"dead letters without direct gets", "jetstream/dlq-stream.json", `"allow_direct": true`, `"allow_direct": false`, validateJetStream},
		{"relay may publish intents", "nats/auth.conf", `"notifications.>",`, `"notifications.>", "intents.>",`, nats},
		{"relay reads others' replies", "nats/auth.conf", `allow: ["_INBOX_relay.>"]`, `allow: ["_INBOX.>"]`, nats},
		{"compose verify as consumer", "compose.yaml", "postgres://jetinbox_verifier@", "postgres://jetinbox_consumer@", compose},

		{"readme advisories after intents", "README.md", readmeAdvisories + readmeRescue + readmeIntents, readmeIntents + readmeAdvisories + readmeRescue, validateReadme},
		{"readme rescue consumer missing", "README.md", "< deploy/jetstream/ledger-rescue-consumer.json\n", "\n", validateReadme},

		{"dockerfile missing binary", "Dockerfile", "/out/producer /out/jetinbox", "/out/producer", validateDockerfile},

		{"consumer holds half its memory in messages", "kubernetes/consumer-deployment.yaml", "value: 64MiB", "value: 256MiB", validateK8s},
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
		{"helm nats-box on", "kubernetes/nats-values.yaml", "natsBox:\n  enabled: false", "natsBox:\n  enabled: true", helm},
		{"helm seed in the values", "kubernetes/nats-values.yaml", "natsBox:\n  enabled: false", "natsBox:\n  enabled: false\n  contexts:\n    default:\n      nkey:\n        secretName: nats-admin-nkey", helm},
		{"nats policy opens monitoring", "kubernetes/nats-networkpolicy.yaml", "        - port: 7777", "        - port: 8222", validateK8s},
		{"nats policy clients from every namespace", "kubernetes/nats-networkpolicy.yaml", "              kubernetes.io/metadata.name: producers\n", "              {}\n", validateK8s},
		{"nats policy clients from anywhere", "kubernetes/nats-networkpolicy.yaml", "        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: producers\n", "        - ipBlock:\n            cidr: 0.0.0.0/0\n", validateK8s},
		{"nats policy any port", "kubernetes/nats-networkpolicy.yaml", "      ports:\n        - port: 6222\n          protocol: TCP\n", "", validateK8s},
		{"nats policy egress only", "kubernetes/nats-networkpolicy.yaml", "policyTypes: [Ingress]", "policyTypes: [Egress]", validateK8s},
		{"nats policy selects nats-box", "kubernetes/nats-networkpolicy.yaml", "      app.kubernetes.io/component: nats\n  policyTypes", "      app.kubernetes.io/component: nats-box\n  policyTypes", validateK8s},
		{"nats policy in jetinbox's namespace", "kubernetes/nats-networkpolicy.yaml", "  namespace: nats\n", "", validateK8s},
		{"nats policy in the kustomization", "kubernetes/kustomization.yaml", "  - networkpolicy.yaml\n", "  - networkpolicy.yaml\n  - nats-networkpolicy.yaml\n", validateK8s},
		{"admin pod restarts", "kubernetes/nats-admin-pod.yaml", "restartPolicy: Never", "restartPolicy: OnFailure", validateK8s},
		{"admin pod without deadline", "kubernetes/nats-admin-pod.yaml", "  activeDeadlineSeconds: 3600\n", "", validateK8s},
		{"admin pod as a deployment", "kubernetes/nats-admin-pod.yaml", "kind: Pod", "kind: Deployment", validateK8s},
		{"readme admin seed left in the cluster", "README.md", "kubectl -n nats delete pod/nats-admin secret/nats-admin\n", "", validateReadme},
		{"readme nats-box", "README.md", readmeIntents, strings.ReplaceAll(readmeIntents, "nats-admin", "deploy/nats-box"), validateReadme},
		{"readme no nats policy", "README.md", "kubectl -n nats apply -f deploy/kubernetes/nats-networkpolicy.yaml\n", "", validateReadme},

		{"alerts key typo", "prometheus/alerts.yml", "expr: max by (job, kind) (jetinbox_verify_violations{job=\"jetinbox-verify\"}) > 0", "exp: max by (job, kind) (jetinbox_verify_violations{job=\"jetinbox-verify\"}) > 0", validateAlerts},
		{"alerts promql typo", "prometheus/alerts.yml", "sum by (job) (increase(jetinbox_dead_letters_total[15m])) > 0", "sum by (job) (increse(jetinbox_dead_letters_total[15m])) > 0", validateAlerts},
		{"alerts stale threshold", "prometheus/alerts.yml", "(jetinbox_consumer_ack_pending_messages) > 21600", "(jetinbox_consumer_ack_pending_messages) > 900", validateAlerts},
		{"alerts metric typo", "prometheus/alerts.yml", "increase(jetinbox_conflicts_total[15m])", "increase(jetinbox_conflict_total[15m])", validateAlerts},
		{"prometheus key typo", "prometheus/prometheus.yml", "scrape_configs:", "scrape_config:", validatePrometheusConfig},
		{"prometheus target", "prometheus/prometheus.yml", `"consumer:8080"`, `"consumer:9090"`, validatePrometheusConfig},

		{"dashboard key typo", "grafana/jetinbox-dashboard.json", `"targets"`, `"target"`, validateDashboard},
		{"dashboard promql typo", "grafana/jetinbox-dashboard.json", `histogram_quantile(0.99, sum by (le) (rate(jetinbox_publish_to_commit_seconds_bucket`, `histogram_quantile(0.99, sum by (le) (rate(jetinbox_publish_to_commit_seconds_bucket[`, validateDashboard},

		{"pg setting typo", "postgres/postgresql.conf.snippet", "idle_in_transaction_session_timeout = '60s'", "idle_in_transaction_timeout = '60s'", pgconf},
		{"pg fsync off", "postgres/postgresql.conf.snippet", "fsync = on", "fsync = off", pgconf},

		// The HTTP intake and the relay of its outbox.
		{"compose intake on the consumer's server", "compose.yaml", "postgres://jetinbox_intake@intake-postgres:", "postgres://jetinbox_intake@postgres:", compose},
		{"compose intake prunes under its role", "compose.yaml", `"-prune-interval", "0", `, "", compose},
		{"compose intake without TLS", "compose.yaml", `"-tls-cert", "/run/jetinbox/intake_cert", "-tls-key", "/run/jetinbox/intake_key", `, "", compose},
		{"compose intake's tenants not copied", "compose.yaml", "copy intake ca intake_pgpass intake_tenants intake_cert intake_key", "copy intake ca intake_pgpass intake_cert intake_key", compose},
		{"compose intake's key not copied", "compose.yaml", "copy intake ca intake_pgpass intake_tenants intake_cert intake_key", "copy intake ca intake_pgpass intake_tenants intake_cert", compose},
		{"compose intake's tenants file not generated", "compose.yaml", "file: ./secrets/intake/tenants.json", "file: ./secrets/intake/tenant.json", compose},
		{"compose intake role before its tables", "compose.yaml", "      intake-migrate: {condition: service_completed_successfully}\n    secrets: [ca, postgres_password", "      intake-postgres: {condition: service_healthy}\n    secrets: [ca, postgres_password", compose},
		{"compose intake's relay into notifications", "compose.yaml", "JETINBOX_RELAY_STREAM: INTENTS", "JETINBOX_RELAY_STREAM: NOTIFICATIONS", compose},
		{"compose intake's relay on the consumer's outbox", "compose.yaml", "postgres://jetinbox_relay@intake-postgres:", "postgres://jetinbox_relay@postgres:", compose},
		{"compose intake's server in the consumer's volume", "compose.yaml", "intake-pg-data:/var/lib/postgresql/data", "pg-data:/var/lib/postgresql/data", compose},
		{"compose intake short grace", "compose.yaml", "    stop_grace_period: 45s\n    depends_on:\n      intake-db-setup", "    stop_grace_period: 30s\n    depends_on:\n      intake-db-setup", compose},
		{"kubernetes intake reaches NATS", "kubernetes/networkpolicy.yaml", "  egress:\n    - to:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: db\n",
			"  egress:\n    - to:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: nats\n      ports:\n        - port: 4222\n          protocol: TCP\n    - to:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: db\n", validateK8s},
		{"kubernetes intake open to every source", "kubernetes/networkpolicy.yaml", "    - from:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: ingress-nginx\n          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: ingress-nginx\n      ports:", "    - ports:", validateK8s},
		{"kubernetes intake open to the ingress namespace", "kubernetes/networkpolicy.yaml", "          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: ingress-nginx\n", "", validateK8s},
		{"kubernetes intake on the consumer's server", "kubernetes/intake-deployment.yaml", "postgres://jetinbox_intake@intake-postgres.db.svc", "postgres://jetinbox_intake@postgres.db.svc", validateK8s},
		{"kubernetes intake as the consumer", "kubernetes/intake-deployment.yaml", "postgres://jetinbox_intake@", "postgres://jetinbox_consumer@", validateK8s},
		{"kubernetes intake ready when alive", "kubernetes/intake-deployment.yaml", "path: /readyz", "path: /healthz", validateK8s},
		{"kubernetes intake writable root", "kubernetes/intake-deployment.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", validateK8s},
		{"kubernetes intake may escalate", "kubernetes/intake-deployment.yaml", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", validateK8s},
		{"kubernetes intake without a memory limit", "kubernetes/intake-deployment.yaml", "            limits:\n              memory: 256Mi\n", "", validateK8s},
		{"kubernetes intake prunes under its role", "kubernetes/intake-deployment.yaml", "            - -prune-interval\n            - \"0\"\n", "", validateK8s},
		{"kubernetes intake listens on loopback", "kubernetes/intake-deployment.yaml", "            - 0.0.0.0:8443\n", "            - 127.0.0.1:8443\n", validateK8s},
		{"kubernetes intake key not in its Secret", "kubernetes/intake-deployment.yaml", "/etc/jetinbox/tls/tls.key", "/etc/jetinbox/tls/key.pem", validateK8s},
		{"kubernetes intake short grace", "kubernetes/intake-deployment.yaml", "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 30", validateK8s},
		{"kubernetes intake pdb blocks drains", "kubernetes/intake-pdb.yaml", "minAvailable: 1", "minAvailable: 2", validateK8s},
		{"kubernetes intake service on the consumers", "kubernetes/intake-service.yaml", "    app.kubernetes.io/component: intake\n  ports:", "    app.kubernetes.io/component: consumer\n  ports:", validateK8s},
		{"kubernetes intake tenants committed", "kubernetes/secrets.template.yaml", `tenants.json: ""`, `tenants.json: "{}"`, validateK8s},
		{"kubernetes intake migrate on the consumer's server", "kubernetes/intake-migrate-job.yaml", "@intake-postgres.db.svc", "@postgres.db.svc", validateK8s},
		{"kubernetes intake migrate with its pods", "kubernetes/kustomization.yaml", "  - intake-deployment.yaml\n", "  - intake-migrate-job.yaml\n  - intake-deployment.yaml\n", validateK8s},
		{"kubernetes intake relay into notifications", "kubernetes/intake-relay-deployment.yaml", "value: INTENTS", "value: NOTIFICATIONS", validateK8s},
		{"kubernetes intake relay on the relay's inbox", "kubernetes/intake-relay-deployment.yaml", "value: _INBOX_producer", "value: _INBOX_relay", validateK8s},
		{"kubernetes intake relay on the consumer's outbox", "kubernetes/intake-relay-deployment.yaml", "postgres://jetinbox_relay@intake-postgres.db.svc", "postgres://jetinbox_relay@postgres.db.svc", validateK8s},
		{"kubernetes intake relay with the relay's Secret", "kubernetes/intake-relay-deployment.yaml", "secretName: jetinbox-intake-relay-nats", "secretName: jetinbox-relay-nats", validateK8s},
		{"kubernetes intake relay off NATS", "kubernetes/nats-networkpolicy.yaml", "          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: jetinbox\n", "          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: jetinbox\n              app.kubernetes.io/component: consumer\n", validateK8s},
		// The delivery dispatcher.
		{"compose deliver as the consumer", "compose.yaml", "postgres://jetinbox_deliver@postgres:", "postgres://jetinbox_consumer@postgres:", compose},
		{"compose deliver on the intake's server", "compose.yaml", "postgres://jetinbox_deliver@postgres:", "postgres://jetinbox_deliver@intake-postgres:", compose},
		{"compose deliver's second secret not copied", "compose.yaml", "copy deliver ca jetinbox_deliver_pgpass webhook_partner_1 webhook_partner_2", "copy deliver ca jetinbox_deliver_pgpass webhook_partner_1", compose},
		{"compose deliver role before grants", "compose.yaml", "      db-grants: {condition: service_completed_successfully}\n    secrets: [ca, postgres_password, jetinbox_deliver_password]", "      migrate: {condition: service_completed_successfully}\n    secrets: [ca, postgres_password, jetinbox_deliver_password]", compose},
		{"compose deliver without a memory limit", "compose.yaml", "          memory: 256M\n", "", compose},
		{"compose deliver metrics on loopback", "compose.yaml", `"-http", "0.0.0.0:9095"`, `"-http", "127.0.0.1:9095"`, compose},
		{"compose deliver short grace", "compose.yaml", "    stop_grace_period: 45s\n    deploy:", "    stop_grace_period: 5s\n    deploy:", compose},
		{"compose deliver writable root", "compose.yaml", "    <<: *jetinbox\n    entrypoint: [\"/usr/local/bin/jetinbox\"]\n    command: [\"deliver\"", "    <<: *jetinbox\n    read_only: false\n    entrypoint: [\"/usr/local/bin/jetinbox\"]\n    command: [\"deliver\"", compose},
		{"deliver endpoint with one secret", "deliver/endpoints.json", `, "/run/jetinbox/webhook_partner_2"`, "", compose},
		{"deliver endpoint over http", "deliver/endpoints.json", `"url": "https://`, `"url": "http://`, compose},
		{"deliver endpoint truncating keys", "deliver/endpoints.json", `"key_max_len": 255`, `"key_max_len": 16`, compose},
		{"deliver route to an unknown endpoint", "deliver/routes.json", `["partner"]`, `["partnr"]`, compose},
		{"kubernetes deliver as the consumer", "kubernetes/deliver-deployment.yaml", "postgres://jetinbox_deliver@", "postgres://jetinbox_consumer@", validateK8s},
		{"kubernetes deliver one replica", "kubernetes/deliver-deployment.yaml", "replicas: 2", "replicas: 1", validateK8s},
		{"kubernetes deliver writable root", "kubernetes/deliver-deployment.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", validateK8s},
		{"kubernetes deliver without a memory limit", "kubernetes/deliver-deployment.yaml", "              memory: 256Mi\n", "", validateK8s},
		{"kubernetes deliver secrets elsewhere", "kubernetes/deliver-deployment.yaml", "              mountPath: /run/jetinbox\n", "              mountPath: /etc/jetinbox/webhooks\n", validateK8s},
		{"kubernetes deliver second secret missing", "kubernetes/secrets.template.yaml", "  webhook_partner_2: \"\"\n", "", validateK8s},
		{"kubernetes deliver endpoints elsewhere", "kubernetes/deliver-deployment.yaml", `"/etc/jetinbox/endpoints/endpoints.json"`, `"/etc/jetinbox/endpoints.json"`, validateK8s},
		{"kubernetes deliver metrics not scraped", "kubernetes/deliver-service.yaml", `prometheus.io/port: "9095"`, `prometheus.io/port: "9093"`, validateK8s},
		{"kubernetes deliver reaches the metadata address", "kubernetes/networkpolicy.yaml", "              - 169.254.0.0/16\n", "", validateK8s},
		{"kubernetes deliver reaches NATS", "kubernetes/networkpolicy.yaml", "        - port: 443\n", "        - port: 4222\n", validateK8s},
		{"kubernetes deliver not applied", "kubernetes/kustomization.yaml", "  - deliver-deployment.yaml\n", "", validateK8s},
		{"alerts deliver any job", "prometheus/alerts.yml", `jetinbox_delivery_oldest_pending_seconds{job="jetinbox-deliver"}`, `jetinbox_delivery_oldest_pending_seconds`, validateAlerts},
		{"alerts deliver backlog past the retention", "prometheus/alerts.yml", "(jetinbox_delivery_oldest_pending_seconds{job=\"jetinbox-deliver\"}) > 1800", "(jetinbox_delivery_oldest_pending_seconds{job=\"jetinbox-deliver\"}) > 86400", validateAlerts},
		{"alerts deliver no endpoint", "prometheus/alerts.yml", "sum by (job, endpoint) (increase(jetinbox_delivery_dead_letters_total", "sum by (job) (increase(jetinbox_delivery_dead_letters_total", validateAlerts},
		{"readme deliver endpoints not made", "README.md", "kubectl -n jetinbox create configmap jetinbox-deliver-endpoints", "kubectl -n jetinbox create configmap jetinbox-deliver-endpoint", validateK8s},
		{"prometheus deliver target", "prometheus/prometheus.yml", `"deliver:9095"`, `"deliver:9093"`, validatePrometheusConfig},
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
	readmeAdvisories = "kubectl -n nats exec -i nats-admin -- nats stream add INTENTS_ADVISORIES --config /dev/stdin < deploy/jetstream/advisories-stream.json\n"
	readmeRescue     = "kubectl -n nats exec -i nats-admin -- nats consumer add INTENTS_ADVISORIES ledger --config /dev/stdin < deploy/jetstream/ledger-rescue-consumer.json\n"
	readmeIntents    = "kubectl -n nats exec -i nats-admin -- nats stream add INTENTS --config /dev/stdin < deploy/jetstream/intents-stream.json\n"
)

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
