package deploy_test

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

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
	deploy appsv1.Deployment
	svc    corev1.Service
	pdb    policyv1.PodDisruptionBudget
	job    batchv1.Job
	verify appsv1.Deployment
	vsvc   corev1.Service
	relay  appsv1.Deployment
	rsvc   corev1.Service
	// The HTTP intake: its Deployment, Service, PDB and migrate Job, and
	// the relay of its outbox with its Service.
	intake  appsv1.Deployment
	isvc    corev1.Service
	ipdb    policyv1.PodDisruptionBudget
	ijob    batchv1.Job
	irelay  appsv1.Deployment
	irsvc   corev1.Service
	secrets map[string]corev1.Secret
}

func loadK8s(fsys files) (*k8sSet, error) {
	var k k8sSet
	for name, v := range map[string]any{
		"kubernetes/consumer-deployment.yaml":     &k.deploy,
		"kubernetes/consumer-service.yaml":        &k.svc,
		"kubernetes/consumer-pdb.yaml":            &k.pdb,
		"kubernetes/migrate-job.yaml":             &k.job,
		"kubernetes/verify-deployment.yaml":       &k.verify,
		"kubernetes/verify-service.yaml":          &k.vsvc,
		"kubernetes/relay-deployment.yaml":        &k.relay,
		"kubernetes/relay-service.yaml":           &k.rsvc,
		"kubernetes/intake-deployment.yaml":       &k.intake,
		"kubernetes/intake-service.yaml":          &k.isvc,
		"kubernetes/intake-pdb.yaml":              &k.ipdb,
		"kubernetes/intake-migrate-job.yaml":      &k.ijob,
		"kubernetes/intake-relay-deployment.yaml": &k.irelay,
		"kubernetes/intake-relay-service.yaml":    &k.irsvc,
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
			// An argument that is a file in a mounted Secret names a key of it
			// (the intake's -tls-cert and -tls-key).
			for _, a := range slices.Concat(c.Command, c.Args) {
				for dir, s := range paths {
					for _, m := range regexp.MustCompile(regexp.QuoteMeta(dir)+`/([A-Za-z0-9_.-]+)`).FindAllStringSubmatch(a, -1) {
						check(secretKeys[s][m[1]], "%s/%s: argument %s refers to %s/%s, but Secret %s has no key %s", what, c.Name, a, dir, m[1], s, m[1])
					}
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
	check(env["NATS_INBOX_PREFIX"].Value == inboxPrefix["consumer"], "consumer NATS_INBOX_PREFIX %q, want the consumer user's own %q", env["NATS_INBOX_PREFIX"].Value, inboxPrefix["consumer"])
	check(env["JETINBOX_STREAM"].Value == js.intents.Name, "consumer JETINBOX_STREAM %q, the stream is %q", env["JETINBOX_STREAM"].Value, js.intents.Name)
	check(env["JETINBOX_DURABLE"].Value == js.ledger.Durable, "consumer JETINBOX_DURABLE %q, the durable is %q", env["JETINBOX_DURABLE"].Value, js.ledger.Durable)
	check(strings.HasPrefix(env["NATS_URL"].Value, "tls://"), "consumer NATS_URL must be tls://")
	check(strings.Contains(env["DATABASE_URL"].Value, "sslmode=verify-full"), "consumer DATABASE_URL must use sslmode=verify-full")
	check(!regexp.MustCompile(`://[^/@]*:[^/@]*@`).MatchString(env["DATABASE_URL"].Value), "consumer DATABASE_URL must not carry a password")
	drain, err := time.ParseDuration(env["JETINBOX_DRAIN_TIMEOUT"].Value)
	check(err == nil && drain >= 30*time.Second, "consumer JETINBOX_DRAIN_TIMEOUT %q", env["JETINBOX_DRAIN_TIMEOUT"].Value)
	check(spec.TerminationGracePeriodSeconds != nil && time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second > drain,
		"terminationGracePeriodSeconds must exceed the drain timeout %v", drain)
	host, portStr, _ := strings.Cut(env["JETINBOX_HTTP_ADDR"].Value, ":")
	check(host == "0.0.0.0", "consumer JETINBOX_HTTP_ADDR %q: want an explicit 0.0.0.0:port (the binary's default is loopback, which probes cannot reach)", env["JETINBOX_HTTP_ADDR"].Value)
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
	// The messages it holds are bounded in bytes, at most a quarter of the
	// memory limit: the rest is the runtime, the batches' work and slack.
	if m := regexp.MustCompile(`^(\d+)MiB$`).FindStringSubmatch(env["JETINBOX_MAX_BYTES"].Value); m == nil {
		check(false, "consumer JETINBOX_MAX_BYTES %q, want an explicit NMiB", env["JETINBOX_MAX_BYTES"].Value)
	} else {
		mib, _ := strconv.ParseInt(m[1], 10, 64)
		check(mib<<20 <= c.Resources.Limits.Memory().Value()/4, "consumer JETINBOX_MAX_BYTES %s is more than a quarter of the memory limit %s", env["JETINBOX_MAX_BYTES"].Value, c.Resources.Limits.Memory())
	}
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
	// The ledger credits only accounts that exist: the Job opens them
	// after migrating, as the schema owner.
	a, ok := findContainer(jspec.InitContainers, "accounts")
	check(ok && len(a.Command) > 2 && a.Command[1] == "accounts" && a.Command[2] == "-open", "Job needs an init container accounts running `jetinbox accounts -open …`")
	check(ok && slices.IndexFunc(jspec.InitContainers, func(c corev1.Container) bool { return c.Name == "accounts" }) >
		slices.IndexFunc(jspec.InitContainers, func(c corev1.Container) bool { return c.Name == "migrate" }), "accounts must run after migrate")
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

	// The verifier: one replica of `jetinbox verify -watch`, judging the
	// consumer's scope and durable, with its own NATS Secret, scraped on
	// the port it serves.
	typeMeta("verify-deployment.yaml", "apps/v1", "Deployment", k.verify.APIVersion, k.verify.Kind)
	typeMeta("verify-service.yaml", "v1", "Service", k.vsvc.APIVersion, k.vsvc.Kind)
	vspec := k.verify.Spec.Template.Spec
	check(k.verify.Spec.Replicas != nil && *k.verify.Spec.Replicas == 1, "verify: want one replica")
	check(labelsMatch(k.verify.Spec.Selector.MatchLabels, k.verify.Spec.Template.Labels), "verify: selector does not match the pod labels")
	check(labelsMatch(k.vsvc.Spec.Selector, k.verify.Spec.Template.Labels) && !labelsMatch(k.vsvc.Spec.Selector, k.deploy.Spec.Template.Labels),
		"verify Service must select the verify pods and not the consumers")
	v, ok := findContainer(vspec.Containers, "verify")
	check(ok, "verify: no container named verify")
	if ok {
		args := strings.Join(slices.Concat(v.Command, v.Args), " ")
		check(strings.Contains(args, "jetinbox verify -watch "), "verify runs %q, want jetinbox verify -watch", args)
		port := ""
		if len(v.Ports) > 0 {
			port = strconv.Itoa(int(v.Ports[0].ContainerPort))
		}
		check(port != "" && strings.Contains(args, "-http 0.0.0.0:"+port), "verify: -http must serve on the container port %s of every interface (the default is loopback): %q", port, args)
		check(k.vsvc.Annotations["prometheus.io/port"] == port, "verify Service scrape port %q, the container serves %s", k.vsvc.Annotations["prometheus.io/port"], port)
		check(v.LivenessProbe != nil && v.LivenessProbe.HTTPGet != nil && v.LivenessProbe.HTTPGet.Path == "/healthz", "verify: liveness must probe /healthz")
		ve, ce := envOf(v), map[string]corev1.EnvVar{}
		if c, ok := findContainer(spec.Containers, "consumer"); ok {
			ce = envOf(c)
		}
		for _, key := range []string{"JETINBOX_SCOPE", "JETINBOX_DURABLE", "JETINBOX_STREAM"} {
			check(ve[key].Value != "" && ve[key].Value == ce[key].Value, "verify: %s %q, the consumer's is %q", key, ve[key].Value, ce[key].Value)
		}
		check(ve["NATS_INBOX_PREFIX"].Value == inboxPrefix["verify"], "verify NATS_INBOX_PREFIX %q, want the verify user's own %q", ve["NATS_INBOX_PREFIX"].Value, inboxPrefix["verify"])
		check(strings.Contains(ve["DATABASE_URL"].Value, "sslmode=verify-full"), "verify DATABASE_URL must use sslmode=verify-full")
		check(strings.Contains(ve["DATABASE_URL"].Value, "jetinbox_verifier@"), "verify must connect as jetinbox_verifier, the role that may only read: %q", ve["DATABASE_URL"].Value)
		check(v.SecurityContext != nil && v.SecurityContext.ReadOnlyRootFilesystem != nil && *v.SecurityContext.ReadOnlyRootFilesystem, "verify: read-only root filesystem")
		check(v.Resources.Limits.Memory().Sign() > 0, "verify needs a memory limit")
	}
	vmounted := checkPodSecrets("verify Deployment", vspec)
	check(slices.Contains(slices.Collect(maps.Values(vmounted)), "jetinbox-verify-nats"), "verify must use its own NATS Secret jetinbox-verify-nats, mounts %v", vmounted)
	check(slices.Contains(slices.Collect(maps.Values(vmounted)), "jetinbox-verifier-db") && !slices.Contains(slices.Collect(maps.Values(vmounted)), "jetinbox-consumer-db"),
		"verify must read the database with its own Secret jetinbox-verifier-db, not the consumer's: mounts %v", vmounted)

	// The relay: jetinbox relay into NOTIFICATIONS, with its own NATS
	// Secret and its own database role, scraped on the port it serves.
	typeMeta("relay-deployment.yaml", "apps/v1", "Deployment", k.relay.APIVersion, k.relay.Kind)
	typeMeta("relay-service.yaml", "v1", "Service", k.rsvc.APIVersion, k.rsvc.Kind)
	rspec := k.relay.Spec.Template.Spec
	check(labelsMatch(k.relay.Spec.Selector.MatchLabels, k.relay.Spec.Template.Labels), "relay: selector does not match the pod labels")
	check(labelsMatch(k.rsvc.Spec.Selector, k.relay.Spec.Template.Labels) && !labelsMatch(k.rsvc.Spec.Selector, k.deploy.Spec.Template.Labels) &&
		!labelsMatch(k.rsvc.Spec.Selector, k.verify.Spec.Template.Labels), "relay Service must select the relay pods alone")
	check(!labelsMatch(k.deploy.Spec.Selector.MatchLabels, k.relay.Spec.Template.Labels), "the consumer Deployment's selector takes in the relay pods")
	check(rspec.TerminationGracePeriodSeconds != nil && *rspec.TerminationGracePeriodSeconds >= 35, "relay: terminationGracePeriodSeconds must outlast a round (the publisher's 30 s retry budget)")
	r, ok := findContainer(rspec.Containers, "relay")
	check(ok, "relay: no container named relay")
	if ok {
		args := strings.Join(slices.Concat(r.Command, r.Args), " ")
		check(strings.Contains(args, "jetinbox relay"), "relay runs %q, want jetinbox relay", args)
		port := ""
		if len(r.Ports) > 0 {
			port = strconv.Itoa(int(r.Ports[0].ContainerPort))
		}
		check(port != "" && strings.Contains(args, "-http 0.0.0.0:"+port), "relay: -http must serve on the container port %s of every interface (the default is loopback): %q", port, args)
		check(k.rsvc.Annotations["prometheus.io/port"] == port, "relay Service scrape port %q, the container serves %s", k.rsvc.Annotations["prometheus.io/port"], port)
		check(r.LivenessProbe != nil && r.LivenessProbe.HTTPGet != nil && r.LivenessProbe.HTTPGet.Path == "/healthz", "relay: liveness must probe /healthz")
		re := envOf(r)
		check(re["JETINBOX_RELAY_STREAM"].Value == "NOTIFICATIONS", "relay JETINBOX_RELAY_STREAM %q, want NOTIFICATIONS (jetstream/notifications-stream.json)", re["JETINBOX_RELAY_STREAM"].Value)
		check(re["NATS_INBOX_PREFIX"].Value == inboxPrefix["relay"], "relay NATS_INBOX_PREFIX %q, want the relay user's own %q", re["NATS_INBOX_PREFIX"].Value, inboxPrefix["relay"])
		check(strings.Contains(re["DATABASE_URL"].Value, "sslmode=verify-full"), "relay DATABASE_URL must use sslmode=verify-full")
		check(strings.Contains(re["DATABASE_URL"].Value, "jetinbox_relay@"), "relay must connect as jetinbox_relay, the role that may only read and mark the outbox: %q", re["DATABASE_URL"].Value)
		check(r.SecurityContext != nil && r.SecurityContext.ReadOnlyRootFilesystem != nil && *r.SecurityContext.ReadOnlyRootFilesystem, "relay: read-only root filesystem")
		check(r.Resources.Limits.Memory().Sign() > 0, "relay needs a memory limit")
	}
	rmounted := slices.Collect(maps.Values(checkPodSecrets("relay Deployment", rspec)))
	check(slices.Contains(rmounted, "jetinbox-relay-nats") && slices.Contains(rmounted, "jetinbox-relay-db") && !slices.Contains(rmounted, "jetinbox-consumer-db"),
		"relay must use its own Secrets jetinbox-relay-nats and jetinbox-relay-db, mounts %v", rmounted)
	if c, ok := findContainer(spec.Containers, "consumer"); ok {
		args := strings.Join(c.Args, " ")
		check(strings.Contains(args, "-follow-ups notifications"), "the consumer does not emit the notifications the relay publishes (-follow-ups notifications): args %q", args)
	}

	errs = append(errs, checkIntakeK8s(k, js, checkSecure, checkPodSecrets))
	errs = append(errs, checkDeliverK8s(fsys, k, checkSecure, checkPodSecrets))
	errs = append(errs, checkNetworkPolicies(fsys, k))
	errs = append(errs, checkNATSNetworkPolicy(fsys, k))
	errs = append(errs, checkAdminPod(fsys))

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
	for _, f := range []string{"networkpolicy.yaml", "relay-deployment.yaml", "relay-service.yaml", "intake-deployment.yaml", "intake-service.yaml", "intake-pdb.yaml", "intake-relay-deployment.yaml", "intake-relay-service.yaml"} {
		check(slices.Contains(kust.Resources, f), "kustomization.yaml does not apply %s", f)
	}
	// The intake's schema and role come before its pods, applied and
	// awaited on their own, as the consumer's migrate Job.
	for _, f := range []string{"migrate-job.yaml", "intake-migrate-job.yaml"} {
		check(!slices.Contains(kust.Resources, f), "kustomization.yaml applies %s with the pods it must precede", f)
	}
	// These live in namespace nats; `kubectl -n jetinbox apply -k` would
	// refuse them.
	for _, f := range []string{"nats-networkpolicy.yaml", "nats-admin-pod.yaml"} {
		check(!slices.Contains(kust.Resources, f), "kustomization.yaml applies %s, which belongs to namespace nats", f)
	}
	return errors.Join(errs...)
}

// natsServerLabels are the labels the NATS chart gives the server pods of
// the release "nats" (its nats.selectorLabels); nats-box's pods have
// component nats-box.
var natsServerLabels = map[string]string{"app.kubernetes.io/name": "nats", "app.kubernetes.io/instance": "nats", "app.kubernetes.io/component": "nats"}

// peer is a pod some traffic comes from: its namespace and labels.
type peer struct {
	name, ns string
	labels   map[string]string
}

// admittedPorts returns the ports ("TCP/4222") pol's ingress rules open to
// p. A peer with an IP block, or selectors with expressions, admits more than
// the check can tell: it is reported through bad.
func admittedPorts(pol networkingv1.NetworkPolicy, p peer, bad func(format string, args ...any)) map[string]bool {
	ports := map[string]bool{}
	for _, r := range pol.Spec.Ingress {
		admitted := len(r.From) == 0
		for _, from := range r.From {
			if from.IPBlock != nil {
				bad("an ingress rule admits the IP block %s", from.IPBlock.CIDR)
				admitted = true
				continue
			}
			if from.NamespaceSelector != nil && len(from.NamespaceSelector.MatchExpressions) > 0 || from.PodSelector != nil && len(from.PodSelector.MatchExpressions) > 0 {
				bad("an ingress rule selects by expressions; use matchLabels")
			}
			nsOK := from.NamespaceSelector == nil && p.ns == pol.Namespace ||
				from.NamespaceSelector != nil && labelsMatch(from.NamespaceSelector.MatchLabels, map[string]string{"kubernetes.io/metadata.name": p.ns})
			podOK := from.PodSelector == nil || labelsMatch(from.PodSelector.MatchLabels, p.labels)
			if nsOK && podOK {
				admitted = true
			}
		}
		if !admitted {
			continue
		}
		if len(r.Ports) == 0 {
			ports["any"] = true
		}
		for _, pt := range r.Ports {
			proto := corev1.ProtocolTCP
			if pt.Protocol != nil {
				proto = *pt.Protocol
			}
			ports[fmt.Sprintf("%s/%s", proto, pt.Port)] = true
		}
	}
	return ports
}

// checkNATSNetworkPolicy: the NATS server pods are selected by a policy in
// namespace nats that opens the client port only to the jetinbox pods, the
// producers' namespace and the admin pod, the route port only to the other
// servers, the exporter only to Prometheus, and the monitoring port 8222
// (unauthenticated: connections, accounts, subjects) to nobody.
func checkNATSNetworkPolicy(fsys files, k *k8sSet) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("nats-networkpolicy.yaml: "+format, args...))
		}
	}
	bad := func(format string, args ...any) { check(false, format, args...) }
	pols, err := networkPolicies(fsys, "kubernetes/nats-networkpolicy.yaml", check)
	if err != nil {
		return err
	}
	for _, p := range pols {
		check(p.Namespace == "nats", "%s is in namespace %q, want nats (the release's)", p.Name, p.Namespace)
	}
	check(len(pols) == 1, "%d policies, want 1", len(pols))
	if len(pols) != 1 {
		return errors.Join(errs...)
	}
	pol := pols[0]
	sel := pol.Spec.PodSelector
	check(maps.Equal(sel.MatchLabels, natsServerLabels) && len(sel.MatchExpressions) == 0,
		"podSelector %v, want the chart's server labels %v", sel.MatchLabels, natsServerLabels)
	check(slices.Contains(pol.Spec.PolicyTypes, networkingv1.PolicyTypeIngress), "policyTypes %v: without Ingress every port is open", pol.Spec.PolicyTypes)
	for _, r := range pol.Spec.Ingress {
		check(len(r.From) > 0, "an ingress rule without from admits every source")
		check(len(r.Ports) > 0, "an ingress rule without ports admits every port")
		for _, pt := range r.Ports {
			check(pt.Port != nil && pt.Port.Type == intstr.Int, "ingress to port %v: name the port by number, as the chart's container ports are named by protocol", pt.Port)
			check(pt.EndPort == nil, "ingress to a port range")
		}
	}

	var admin corev1.Pod
	if err := decodeK8s(fsys, "kubernetes/nats-admin-pod.yaml", &admin); err != nil {
		return errors.Join(append(errs, err)...)
	}
	prometheus := peer{"prometheus", "monitoring", map[string]string{"app.kubernetes.io/name": "prometheus"}}
	want := []struct {
		p     peer
		ports []string
	}{
		{peer{"the consumer", "jetinbox", k.deploy.Spec.Template.Labels}, []string{"TCP/4222"}},
		{peer{"the relay", "jetinbox", k.relay.Spec.Template.Labels}, []string{"TCP/4222"}},
		{peer{"verify", "jetinbox", k.verify.Spec.Template.Labels}, []string{"TCP/4222"}},
		{peer{"the intake's relay", "jetinbox", k.irelay.Spec.Template.Labels}, []string{"TCP/4222"}},
		{peer{"a producer", "producers", map[string]string{"app": "orders"}}, []string{"TCP/4222"}},
		{peer{"the admin pod", admin.Namespace, admin.Labels}, []string{"TCP/4222"}},
		{peer{"another NATS server", "nats", natsServerLabels}, []string{"TCP/6222"}},
		{prometheus, []string{"TCP/7777"}},
		{peer{"a pod of another namespace", "default", map[string]string{"app": "x"}}, nil},
		{peer{"another pod of namespace nats", "nats", map[string]string{"app.kubernetes.io/name": "nats", "app.kubernetes.io/component": "nats-box"}}, nil},
		{peer{"another pod of namespace monitoring", "monitoring", map[string]string{"app.kubernetes.io/name": "grafana"}}, nil},
	}
	for _, w := range want {
		got := admittedPorts(pol, w.p, bad)
		check(!got["TCP/8222"], "%s may reach the monitoring port 8222", w.p.name)
		check(maps.Equal(got, setOf(w.ports)), "%s may reach %v, want %v", w.p.name, slices.Sorted(maps.Keys(got)), w.ports)
	}
	return errors.Join(errs...)
}

func setOf(xs []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// checkAdminPod: the admin's seed is online only while an operator's task
// runs: the admin pod is a bare pod that is never restarted, ends by itself,
// and mounts the Secret the README creates for the task and deletes after.
func checkAdminPod(fsys files) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("nats-admin-pod.yaml: "+format, args...))
		}
	}
	var p corev1.Pod
	if err := decodeK8s(fsys, "kubernetes/nats-admin-pod.yaml", &p); err != nil {
		return err
	}
	check(p.APIVersion == "v1" && p.Kind == "Pod", "%s %s, want a bare v1 Pod (a controller would keep the seed running)", p.APIVersion, p.Kind)
	check(p.Namespace == "nats", "namespace %q, want nats", p.Namespace)
	check(p.Spec.RestartPolicy == corev1.RestartPolicyNever, "restartPolicy %q, want Never", p.Spec.RestartPolicy)
	d := p.Spec.ActiveDeadlineSeconds
	check(d != nil && *d > 0 && *d <= 4*3600, "activeDeadlineSeconds %v: a forgotten pod must end within hours", d)
	check(p.Spec.AutomountServiceAccountToken != nil && !*p.Spec.AutomountServiceAccountToken, "the pod needs no service account token")
	var secrets []string
	for _, v := range p.Spec.Volumes {
		if v.Secret != nil {
			secrets = append(secrets, v.Secret.SecretName)
		}
	}
	check(slices.Equal(secrets, []string{"nats-admin"}), "mounts the Secrets %v, want nats-admin alone (created for the task and deleted after it)", secrets)
	for _, c := range p.Spec.Containers {
		sc := c.SecurityContext
		check(sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
			"container %s: want a read-only root and no privilege escalation", c.Name)
	}
	return errors.Join(errs...)
}

// checkNetworkPolicies: the consumer and verify pods are each selected by
// a policy that governs both directions and lets in only their http port
// from named sources (the kubelet's probes come from the node, which
// policies always admit), and lets out only NATS (4222), PostgreSQL (5432)
// and DNS (53), each to named destinations.
func checkNetworkPolicies(fsys files, k *k8sSet) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("networkpolicy.yaml: "+format, args...))
		}
	}
	pols, err := networkPolicies(fsys, "kubernetes/networkpolicy.yaml", check)
	if err != nil {
		return err
	}
	allowedOut := map[string]bool{"TCP/4222": true, "TCP/5432": true, "UDP/53": true, "TCP/53": true}
	for _, pod := range []struct {
		name string
		d    appsv1.Deployment
	}{{"consumer", k.deploy}, {"relay", k.relay}, {"verify", k.verify}, {"intake-relay", k.irelay}} {
		labels := pod.d.Spec.Template.Labels
		var selected []networkingv1.NetworkPolicy
		for _, p := range pols {
			if len(p.Spec.PodSelector.MatchLabels) > 0 && len(p.Spec.PodSelector.MatchExpressions) == 0 && labelsMatch(p.Spec.PodSelector.MatchLabels, labels) {
				selected = append(selected, p)
			}
		}
		check(len(selected) == 1, "%s pods are selected by %d policies, want 1", pod.name, len(selected))
		if len(selected) != 1 {
			continue
		}
		spec := selected[0].Spec
		check(slices.Contains(spec.PolicyTypes, networkingv1.PolicyTypeIngress) && slices.Contains(spec.PolicyTypes, networkingv1.PolicyTypeEgress),
			"%s: policyTypes %v, want Ingress and Egress (a missing one allows everything that way)", pod.name, spec.PolicyTypes)
		check(len(spec.Ingress) > 0, "%s: no ingress rule: Prometheus could not scrape", pod.name)
		for _, r := range spec.Ingress {
			check(len(r.From) > 0, "%s: an ingress rule without from admits every source", pod.name)
			check(len(r.Ports) > 0, "%s: an ingress rule without ports admits every port", pod.name)
			for _, p := range r.Ports {
				check(p.Port != nil && p.Port.String() == "http" && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP),
					"%s: ingress to port %v, want only the http port", pod.name, p.Port)
			}
			for _, from := range r.From {
				check(from.IPBlock == nil || from.IPBlock.CIDR != "0.0.0.0/0", "%s: ingress from anywhere", pod.name)
			}
		}
		seen := map[string]bool{}
		for _, r := range spec.Egress {
			check(len(r.To) > 0, "%s: an egress rule without to reaches every destination", pod.name)
			check(len(r.Ports) > 0, "%s: an egress rule without ports reaches every port", pod.name)
			for _, p := range r.Ports {
				proto := corev1.ProtocolTCP
				if p.Protocol != nil {
					proto = *p.Protocol
				}
				key := fmt.Sprintf("%s/%s", proto, p.Port)
				check(p.Port != nil && allowedOut[key], "%s: egress to %s, want only NATS 4222, PostgreSQL 5432 and DNS 53", pod.name, key)
				seen[key] = true
			}
			for _, to := range r.To {
				check(to.IPBlock == nil || to.IPBlock.CIDR != "0.0.0.0/0", "%s: egress to anywhere", pod.name)
			}
		}
		for k := range allowedOut {
			check(seen[k], "%s: no egress to %s: it could not reach NATS, PostgreSQL or DNS", pod.name, k)
		}
	}

	// The intake: its TLS port from the ingress controller's pods, its
	// http port from Prometheus, nothing else in; PostgreSQL and DNS out,
	// never NATS.
	var selected []networkingv1.NetworkPolicy
	for _, p := range pols {
		if len(p.Spec.PodSelector.MatchLabels) > 0 && len(p.Spec.PodSelector.MatchExpressions) == 0 && labelsMatch(p.Spec.PodSelector.MatchLabels, k.intake.Spec.Template.Labels) {
			selected = append(selected, p)
		}
	}
	check(len(selected) == 1, "intake pods are selected by %d policies, want 1", len(selected))
	if len(selected) == 1 {
		pol := selected[0]
		pol.Namespace = "jetinbox" // where the kustomization applies it
		spec := pol.Spec
		check(slices.Contains(spec.PolicyTypes, networkingv1.PolicyTypeIngress) && slices.Contains(spec.PolicyTypes, networkingv1.PolicyTypeEgress),
			"intake: policyTypes %v, want Ingress and Egress", spec.PolicyTypes)
		for _, r := range spec.Ingress {
			check(len(r.From) > 0, "intake: an ingress rule without from admits every source")
			check(len(r.Ports) > 0, "intake: an ingress rule without ports admits every port")
		}
		bad := func(format string, args ...any) { check(false, "intake: "+format, args...) }
		for _, w := range []struct {
			p     peer
			ports []string
		}{
			{peer{"the ingress controller", "ingress-nginx", map[string]string{"app.kubernetes.io/name": "ingress-nginx"}}, []string{"TCP/https"}},
			{peer{"prometheus", "monitoring", map[string]string{"app.kubernetes.io/name": "prometheus"}}, []string{"TCP/http"}},
			{peer{"the consumer", "jetinbox", k.deploy.Spec.Template.Labels}, nil},
			{peer{"a pod of another namespace", "default", map[string]string{"app": "x"}}, nil},
			{peer{"another pod of the ingress namespace", "ingress-nginx", map[string]string{"app": "x"}}, nil},
		} {
			got := admittedPorts(pol, w.p, bad)
			check(maps.Equal(got, setOf(w.ports)), "intake: %s may reach %v, want %v", w.p.name, slices.Sorted(maps.Keys(got)), w.ports)
		}
		intakeOut := map[string]bool{"TCP/5432": true, "UDP/53": true, "TCP/53": true}
		seen := map[string]bool{}
		for _, r := range spec.Egress {
			check(len(r.To) > 0, "intake: an egress rule without to reaches every destination")
			check(len(r.Ports) > 0, "intake: an egress rule without ports reaches every port")
			for _, p := range r.Ports {
				proto := corev1.ProtocolTCP
				if p.Protocol != nil {
					proto = *p.Protocol
				}
				key := fmt.Sprintf("%s/%s", proto, p.Port)
				check(p.Port != nil && intakeOut[key], "intake: egress to %s, want only PostgreSQL 5432 and DNS 53 (it talks to no NATS server)", key)
				seen[key] = true
			}
			for _, to := range r.To {
				check(to.IPBlock == nil, "intake: egress to an IP block")
			}
		}
		for k := range intakeOut {
			check(seen[k], "intake: no egress to %s: it could not reach PostgreSQL or DNS", k)
		}
	}
	return errors.Join(errs...)
}

// checkIntakeK8s: the HTTP intake's Deployment (replicated, probed on
// /healthz and /readyz, TLS from its own Secret, its tenants file from
// another, jetinbox_intake on a database server of its own, no NATS, pruning
// left to the maintainer), its Service and PDB, its migrate Job (the schema
// owner, on that server), and the relay of its outbox (INTENTS, the
// producer's NATS user, jetinbox_relay on the intake's server).
func checkIntakeK8s(k *k8sSet, js *jsDefs, checkSecure func(string, *corev1.PodSecurityContext, *corev1.SecurityContext), checkPodSecrets func(string, corev1.PodSpec) map[string]string) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("kubernetes: "+format, args...))
		}
	}
	typeMeta := func(name, apiVersion, kind, gotAPI, gotKind string) {
		check(gotAPI == apiVersion && gotKind == kind, "%s is %s %s, want %s %s", name, gotAPI, gotKind, apiVersion, kind)
	}
	dbURL := func(e map[string]corev1.EnvVar) (user, host string) {
		u, err := url.Parse(e["DATABASE_URL"].Value)
		if err != nil || u.User == nil {
			return "", ""
		}
		return u.User.Username(), u.Hostname()
	}
	flag := func(args []string, name string) string {
		i := slices.Index(args, name)
		if i < 0 || i+1 >= len(args) {
			return ""
		}
		return args[i+1]
	}
	portOf := func(c corev1.Container, name string) int32 {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
		return 0
	}
	consumerHost := ""
	if c, ok := findContainer(k.deploy.Spec.Template.Spec.Containers, "consumer"); ok {
		_, consumerHost = dbURL(envOf(c))
	}

	typeMeta("intake-deployment.yaml", "apps/v1", "Deployment", k.intake.APIVersion, k.intake.Kind)
	typeMeta("intake-service.yaml", "v1", "Service", k.isvc.APIVersion, k.isvc.Kind)
	typeMeta("intake-pdb.yaml", "policy/v1", "PodDisruptionBudget", k.ipdb.APIVersion, k.ipdb.Kind)
	typeMeta("intake-migrate-job.yaml", "batch/v1", "Job", k.ijob.APIVersion, k.ijob.Kind)
	typeMeta("intake-relay-deployment.yaml", "apps/v1", "Deployment", k.irelay.APIVersion, k.irelay.Kind)
	typeMeta("intake-relay-service.yaml", "v1", "Service", k.irsvc.APIVersion, k.irsvc.Kind)
	all := []appsv1.Deployment{k.deploy, k.relay, k.verify, k.intake, k.irelay}
	for _, d := range []appsv1.Deployment{k.intake, k.irelay} {
		check(d.Spec.Selector != nil && labelsMatch(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels), "%s: selector does not match its pod labels", d.Name)
		for _, o := range all {
			if o.Name == d.Name || d.Spec.Selector == nil {
				continue
			}
			check(!labelsMatch(d.Spec.Selector.MatchLabels, o.Spec.Template.Labels), "%s's selector takes in the pods of %s", d.Name, o.Name)
			check(o.Spec.Selector == nil || !labelsMatch(o.Spec.Selector.MatchLabels, d.Spec.Template.Labels), "%s's selector takes in the pods of %s", o.Name, d.Name)
		}
	}

	// The intake.
	ispec := k.intake.Spec.Template.Spec
	check(k.intake.Spec.Replicas != nil && *k.intake.Spec.Replicas >= 2, "intake: want 2 or more replicas (one drains while the other serves)")
	in, ok := findContainer(ispec.Containers, "intake")
	check(ok, "intake: no container named intake")
	ihost := ""
	if ok {
		args := slices.Concat(in.Command, in.Args)
		joined := strings.Join(args, " ")
		check(strings.Contains(joined, "jetinbox intake"), "intake runs %q, want jetinbox intake", joined)
		check(!slices.Contains(args, "-unsafe-key-optional") && !slices.Contains(args, "-migrate"), "intake runs %q", joined)
		https, http := portOf(in, "https"), portOf(in, "http")
		check(https != 0 && flag(args, "-listen") == fmt.Sprintf("0.0.0.0:%d", https), "intake: -listen %q, want 0.0.0.0 and the container port https %d (the default is loopback)", flag(args, "-listen"), https)
		check(http != 0 && flag(args, "-http") == fmt.Sprintf("0.0.0.0:%d", http), "intake: -http %q, want 0.0.0.0 and the container port http %d, which the probes reach", flag(args, "-http"), http)
		check(flag(args, "-tls-cert") != "" && flag(args, "-tls-key") != "", "intake must serve TLS (-tls-cert, -tls-key): bearer tokens cross the wire")
		check(flag(args, "-prune-interval") == "0", "intake: -prune-interval %q, want 0: its role may not delete keys, the maintainer prunes", flag(args, "-prune-interval"))
		delay, err1 := time.ParseDuration(flag(args, "-drain-delay"))
		drainTO, err2 := time.ParseDuration(flag(args, "-drain-timeout"))
		check(err1 == nil && err2 == nil, "intake: set -drain-delay and -drain-timeout explicitly: %v %v", err1, err2)
		check(ispec.TerminationGracePeriodSeconds != nil && time.Duration(*ispec.TerminationGracePeriodSeconds)*time.Second > delay+drainTO,
			"intake: terminationGracePeriodSeconds must exceed -drain-delay + -drain-timeout %v", delay+drainTO)
		check(in.LivenessProbe != nil && in.LivenessProbe.HTTPGet != nil && in.LivenessProbe.HTTPGet.Path == "/healthz" && in.LivenessProbe.HTTPGet.Port.String() == "http", "intake: liveness must be an HTTP GET of /healthz on port http")
		check(in.ReadinessProbe != nil && in.ReadinessProbe.HTTPGet != nil && in.ReadinessProbe.HTTPGet.Path == "/readyz" && in.ReadinessProbe.HTTPGet.Port.String() == "http", "intake: readiness must be an HTTP GET of /readyz on port http (503 while draining)")
		check(in.Resources.Requests.Cpu().Sign() > 0 && in.Resources.Requests.Memory().Sign() > 0, "intake needs cpu and memory requests")
		check(in.Resources.Limits.Memory().Sign() > 0, "intake needs a memory limit")
		e := envOf(in)
		var user string
		user, ihost = dbURL(e)
		check(user == "jetinbox_intake", "intake must connect as jetinbox_intake (postgres/intake.sql), not %q", user)
		check(ihost != "" && ihost != consumerHost, "intake's database server %q is the consumer's: a relay takes every pending row of its outbox", ihost)
		check(strings.Contains(e["DATABASE_URL"].Value, "sslmode=verify-full"), "intake DATABASE_URL must use sslmode=verify-full")
		check(!regexp.MustCompile(`://[^/@]*:[^/@]*@`).MatchString(e["DATABASE_URL"].Value), "intake DATABASE_URL must not carry a password")
		check(e["PGPASSFILE"].Value != "" && e["JETINBOX_INTAKE_TENANTS"].Value != "", "intake: PGPASSFILE and JETINBOX_INTAKE_TENANTS must be set")
		for name := range e {
			check(!strings.HasPrefix(name, "NATS_"), "intake: %s is set: the intake talks to no NATS server", name)
		}
		checkSecure("intake", ispec.SecurityContext, in.SecurityContext)
		// The tenants file and the certificate are read from their Secrets.
		mountOf := map[string]string{} // secret name -> mount path
		for _, v := range ispec.Volumes {
			for _, m := range in.VolumeMounts {
				if m.Name == v.Name && v.Secret != nil {
					mountOf[v.Secret.SecretName] = m.MountPath
				}
			}
		}
		tenants, tls := mountOf["jetinbox-intake-tenants"], mountOf["jetinbox-intake-tls"]
		check(tenants != "" && strings.HasPrefix(e["JETINBOX_INTAKE_TENANTS"].Value, tenants+"/"), "intake: JETINBOX_INTAKE_TENANTS %q is not in the tenants Secret's mount %q", e["JETINBOX_INTAKE_TENANTS"].Value, tenants)
		check(tls != "" && strings.HasPrefix(flag(args, "-tls-cert"), tls+"/") && strings.HasPrefix(flag(args, "-tls-key"), tls+"/"), "intake: -tls-cert and -tls-key must be in the TLS Secret's mount %q", tls)
		check(k.isvc.Annotations["prometheus.io/port"] == strconv.Itoa(int(http)), "intake Service scrape port %q, the container serves /metrics on %d", k.isvc.Annotations["prometheus.io/port"], http)
	}
	imounted := slices.Sorted(maps.Values(checkPodSecrets("intake Deployment", ispec)))
	check(slices.Equal(imounted, []string{"jetinbox-intake-db", "jetinbox-intake-tenants", "jetinbox-intake-tls"}),
		"intake must mount its own Secrets jetinbox-intake-db, jetinbox-intake-tenants and jetinbox-intake-tls alone, mounts %v", imounted)
	check(len(k.isvc.Spec.Selector) > 0 && labelsMatch(k.isvc.Spec.Selector, k.intake.Spec.Template.Labels), "intake Service does not select the intake pods")
	for _, d := range all {
		check(d.Name == k.intake.Name || !labelsMatch(k.isvc.Spec.Selector, d.Spec.Template.Labels), "intake Service selects the pods of %s", d.Name)
	}
	svcPorts := map[string]string{}
	for _, p := range k.isvc.Spec.Ports {
		svcPorts[p.Name] = p.TargetPort.String()
	}
	check(maps.Equal(svcPorts, map[string]string{"https": "https", "http": "http"}), "intake Service ports %v, want https -> https and http -> http", svcPorts)
	check(k.ipdb.Spec.Selector != nil && labelsMatch(k.ipdb.Spec.Selector.MatchLabels, k.intake.Spec.Template.Labels), "intake PDB selector does not select the intake pods")
	check(k.ipdb.Spec.MinAvailable != nil && k.intake.Spec.Replicas != nil && k.ipdb.Spec.MinAvailable.IntValue() < int(*k.intake.Spec.Replicas),
		"intake PDB minAvailable must be below the replica count, or no node can ever be drained")

	// Its migrate Job.
	jspec := k.ijob.Spec.Template.Spec
	check(jspec.RestartPolicy == corev1.RestartPolicyNever || jspec.RestartPolicy == corev1.RestartPolicyOnFailure, "intake Job restartPolicy %q", jspec.RestartPolicy)
	check(k.ijob.Spec.BackoffLimit != nil && *k.ijob.Spec.BackoffLimit > 0 && k.ijob.Spec.ActiveDeadlineSeconds != nil, "intake Job needs a backoffLimit and an activeDeadlineSeconds")
	m, ok := findContainer(jspec.Containers, "migrate")
	check(ok && slices.Equal(m.Command, []string{"/usr/local/bin/jetinbox", "intake", "-migrate"}), "intake Job needs a container migrate running `jetinbox intake -migrate`")
	if ok {
		user, host := dbURL(envOf(m))
		check(user == "jetinbox_migrator" && strings.Contains(envOf(m)["DATABASE_URL"].Value, "sslmode=verify-full"), "intake migrate must connect as jetinbox_migrator with sslmode=verify-full")
		check(host == ihost, "intake migrate runs on %q, the intake's database is on %q", host, ihost)
	}
	for _, c := range slices.Concat(jspec.InitContainers, jspec.Containers) {
		checkSecure("intake Job container "+c.Name, jspec.SecurityContext, c.SecurityContext)
		check(c.Resources.Limits.Memory().Sign() > 0, "intake Job container %s needs a memory limit", c.Name)
	}
	checkPodSecrets("intake migrate Job", jspec)

	// The relay of its outbox.
	rspec := k.irelay.Spec.Template.Spec
	check(rspec.TerminationGracePeriodSeconds != nil && *rspec.TerminationGracePeriodSeconds >= 35, "intake-relay: terminationGracePeriodSeconds must outlast a round (the publisher's 30 s retry budget)")
	r, ok := findContainer(rspec.Containers, "relay")
	check(ok, "intake-relay: no container named relay")
	if ok {
		args := strings.Join(slices.Concat(r.Command, r.Args), " ")
		check(strings.Contains(args, "jetinbox relay"), "intake-relay runs %q, want jetinbox relay", args)
		port := strconv.Itoa(int(portOf(r, "http")))
		check(port != "0" && strings.Contains(args, "-http 0.0.0.0:"+port), "intake-relay: -http must serve on the container port http %s of every interface: %q", port, args)
		check(k.irsvc.Annotations["prometheus.io/port"] == port, "intake-relay Service scrape port %q, the container serves %s", k.irsvc.Annotations["prometheus.io/port"], port)
		check(r.LivenessProbe != nil && r.LivenessProbe.HTTPGet != nil && r.LivenessProbe.HTTPGet.Path == "/healthz", "intake-relay: liveness must probe /healthz")
		re := envOf(r)
		check(re["JETINBOX_RELAY_STREAM"].Value == js.intents.Name, "intake-relay JETINBOX_RELAY_STREAM %q, the intake's intents go to %q", re["JETINBOX_RELAY_STREAM"].Value, js.intents.Name)
		check(re["NATS_INBOX_PREFIX"].Value == inboxPrefix["producer"], "intake-relay NATS_INBOX_PREFIX %q, want the producer user's own %q", re["NATS_INBOX_PREFIX"].Value, inboxPrefix["producer"])
		check(strings.HasPrefix(re["NATS_URL"].Value, "tls://"), "intake-relay NATS_URL must be tls://")
		user, host := dbURL(re)
		check(user == "jetinbox_relay" && strings.Contains(re["DATABASE_URL"].Value, "sslmode=verify-full"), "intake-relay must connect as jetinbox_relay with sslmode=verify-full: %q", re["DATABASE_URL"].Value)
		check(host == ihost, "intake-relay reads the outbox on %q, the intake writes it on %q", host, ihost)
		check(r.Resources.Limits.Memory().Sign() > 0, "intake-relay needs a memory limit")
		checkSecure("intake-relay", rspec.SecurityContext, r.SecurityContext)
	}
	rmounted := slices.Sorted(maps.Values(checkPodSecrets("intake-relay Deployment", rspec)))
	check(slices.Equal(rmounted, []string{"jetinbox-intake-relay-db", "jetinbox-intake-relay-nats"}), "intake-relay must mount jetinbox-intake-relay-nats and jetinbox-intake-relay-db alone, mounts %v", rmounted)
	check(len(k.irsvc.Spec.Selector) > 0 && labelsMatch(k.irsvc.Spec.Selector, k.irelay.Spec.Template.Labels) && !labelsMatch(k.irsvc.Spec.Selector, k.relay.Spec.Template.Labels),
		"intake-relay Service must select the intake-relay pods alone")
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

// networkPolicies decodes the NetworkPolicy documents of file strictly;
// check hears a document of another kind.
func networkPolicies(fsys files, file string, check func(bool, string, ...any)) ([]networkingv1.NetworkPolicy, error) {
	b, err := fsys.get(file)
	if err != nil {
		return nil, err
	}
	var pols []networkingv1.NetworkPolicy
	for i, doc := range splitYAML(b) {
		var p networkingv1.NetworkPolicy
		if err := yaml.UnmarshalStrict(doc, &p); err != nil {
			return nil, fmt.Errorf("%s document %d: %w", filepath.Base(file), i+1, err)
		}
		check(p.APIVersion == "networking.k8s.io/v1" && p.Kind == "NetworkPolicy", "document %d is %s %s", i+1, p.APIVersion, p.Kind)
		pols = append(pols, p)
	}
	return pols, nil
}
