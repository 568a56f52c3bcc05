package deploy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	composetypes "github.com/compose-spec/compose-go/v2/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/jetinbox/jetinbox/delivery"
)

// deliverTarget is the delivery dispatcher's address in the compose stack,
// as prometheus.yml scrapes it.
const deliverTarget = "deliver:9095"

// The delivery dispatcher's files: its endpoints (the URLs and signing
// secret files it may use, nothing else) and an example routes file for
// `consumer -deliveries`.
const (
	deliverEndpointsFile = "deliver/endpoints.json"
	deliverRoutesFile    = "deliver/routes.json"
)

// loadDeliverEndpoints decodes deliver/endpoints.json strictly, as
// delivery.LoadEndpoints does, without reading the secret files it names
// (they are container paths).
func loadDeliverEndpoints(fsys files) ([]delivery.Endpoint, error) {
	b, err := fsys.get(deliverEndpointsFile)
	if err != nil {
		return nil, err
	}
	var eps []delivery.Endpoint
	if err := decodeStrictJSON(b, &eps); err != nil {
		return nil, fmt.Errorf("%s: %w", deliverEndpointsFile, err)
	}
	return eps, nil
}

func decodeStrictJSON(b []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// checkDeliverEndpoints checks the endpoints file with the dispatcher's
// own parser, its secret files moved from dir (where the container finds
// them) to the files secretFile names, and the routes file against it.
// It returns the longest endpoint timeout.
func checkDeliverEndpoints(fsys files, dir string, secretFile func(name string) (string, bool), check func(bool, string, ...any)) time.Duration {
	eps, err := loadDeliverEndpoints(fsys)
	if err != nil {
		check(false, "%v", err)
		return 0
	}
	moved := slices.Clone(eps)
	for i, e := range moved {
		check(len(e.SecretFiles) >= 2, "%s: endpoint %s lists %d signing secrets; ship two, as during a rotation, so that the layout for rotating is the one in use", deliverEndpointsFile, e.Name, len(e.SecretFiles))
		moved[i].SecretFiles = nil
		for _, f := range e.SecretFiles {
			rel, ok := strings.CutPrefix(f, dir+"/")
			check(ok && !strings.Contains(rel, "/"), "%s: endpoint %s: secret file %s is not in %s, where its secrets are mounted", deliverEndpointsFile, e.Name, f, dir)
			local, found := secretFile(rel)
			check(found, "%s: endpoint %s: secret file %s is not mounted there", deliverEndpointsFile, e.Name, f)
			if found {
				moved[i].SecretFiles = append(moved[i].SecretFiles, local)
			}
		}
		u, err := url.Parse(e.URL)
		check(err == nil && u.Scheme == "https", "%s: endpoint %s: url %q, want https", deliverEndpointsFile, e.Name, e.URL)
		check(!e.AllowHTTP, "%s: endpoint %s: allow_http", deliverEndpointsFile, e.Name)
		check(time.Duration(e.KeyRetention) > 0, "%s: endpoint %s: set key_retention to what the receiver keeps keys for, explicitly", deliverEndpointsFile, e.Name)
	}
	checked, err := delivery.CheckEndpoints(moved)
	check(err == nil, "%s: %v", deliverEndpointsFile, err)
	var longest time.Duration
	names := map[string]bool{}
	for _, e := range checked {
		longest = max(longest, time.Duration(e.Timeout))
		names[e.Name] = true
	}
	rb, err := fsys.get(deliverRoutesFile)
	if err == nil {
		var routes delivery.Routes
		err = decodeStrictJSON(rb, &routes)
		for _, name := range routes.Endpoints() {
			check(names[name], "%s routes to endpoint %s, which %s does not define", deliverRoutesFile, name, deliverEndpointsFile)
		}
	}
	check(err == nil, "%s: %v", deliverRoutesFile, err)
	return longest
}

// checkDeliverCompose: the dispatcher runs as jetinbox_deliver on the
// consumer's server (where the deliveries are), after deliver-db-setup
// made its role (after grants.sql, whose REVOKE deliver.sql follows), with
// the endpoints file mounted and its signing secrets copied by
// secrets-init, serving /metrics where prometheus.yml scrapes it, with
// limits, and a stop grace longer than a call.
func checkDeliverCompose(fsys files, p *composetypes.Project, env func(svc, k string) string, check func(bool, string, ...any)) {
	d, ok := p.Services["deliver"]
	if !ok {
		return
	}
	host := func(svc string) (string, string) {
		u, err := url.Parse(env(svc, "DATABASE_URL"))
		if err != nil || u.User == nil {
			return "", ""
		}
		return u.User.Username(), u.Hostname()
	}
	role, h := host("deliver")
	_, consumerHost := host("consumer")
	check(role == "jetinbox_deliver", "deliver connects as %q, want jetinbox_deliver (postgres/deliver.sql)", role)
	check(h != "" && h == consumerHost, "deliver connects to %q; the deliveries are in the consumer's database on %q", h, consumerHost)
	for k := range d.Environment {
		check(!strings.HasPrefix(k, "NATS_"), "deliver: %s is set: the dispatcher talks to no NATS server", k)
	}
	cmd := strings.Join(d.Command, " ")
	port := deliverTarget[strings.LastIndex(deliverTarget, ":")+1:]
	check(strings.HasPrefix(cmd, "deliver ") && strings.Contains(cmd, "-http 0.0.0.0:"+port),
		"deliver command %v, want jetinbox deliver serving -http on the port prometheus.yml scrapes (%s) of every interface", d.Command, deliverTarget)
	var endpointsAt string
	for i, a := range d.Command {
		if a == "-endpoints" && i+1 < len(d.Command) {
			endpointsAt = d.Command[i+1]
		}
	}
	wd, _ := filepath.Abs(".")
	mounted := false
	for _, v := range d.Volumes {
		if v.Target == endpointsAt {
			mounted = v.Type == composetypes.VolumeTypeBind && v.Source == filepath.Join(wd, filepath.FromSlash(deliverEndpointsFile)) && v.ReadOnly
		}
	}
	check(endpointsAt != "" && mounted, "deliver: -endpoints %q must be %s, mounted read-only", endpointsAt, deliverEndpointsFile)
	// Its signing secrets are what secrets-init copies into its volume.
	var volume string
	for _, v := range d.Volumes {
		if v.Target == "/run/jetinbox" {
			volume = v.Source
		}
	}
	copied := map[string]bool{}
	if si, ok := p.Services["secrets-init"]; ok {
		at := map[string]string{}
		for _, v := range si.Volumes {
			at[strings.TrimPrefix(v.Target, "/out/")] = v.Source
		}
		for _, line := range strings.Split(strings.Join(si.Command, "\n"), "\n") {
			f := strings.Fields(line)
			if len(f) > 2 && f[0] == "copy" && at[f[1]] == volume && volume != "" {
				for _, s := range f[2:] {
					copied[s] = true
				}
			}
		}
	}
	longest := checkDeliverEndpoints(fsys, "/run/jetinbox", func(name string) (string, bool) {
		s, ok := p.Secrets[name]
		if !ok || !copied[name] {
			return "", false
		}
		rel, err := filepath.Rel(filepath.Join(wd, "secrets"), s.File)
		if err != nil || strings.HasPrefix(rel, "..") {
			return "", false
		}
		return filepath.Join(fixture(nil).dir, rel), true
	}, check)
	check(d.StopGracePeriod != nil && time.Duration(*d.StopGracePeriod) > longest, "deliver: stop_grace_period must outlast a call (the longest endpoint timeout, %v)", longest)
	check(d.Deploy != nil && d.Deploy.Resources.Limits != nil && d.Deploy.Resources.Limits.MemoryBytes > 0, "deliver needs a memory limit (deploy.resources.limits.memory)")
	check(len(d.Ports) > 0 && d.Ports[0].HostIP == "127.0.0.1", "deliver's port must be published on the host's loopback only")
	check(d.DependsOn["deliver-db-setup"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "deliver must wait for deliver-db-setup (its role) to complete")
	if g, ok := p.Services["deliver-db-setup"]; ok {
		script := strings.Join(g.Command, "\n")
		var sql string
		for _, v := range g.Volumes {
			if v.Target == "/deliver.sql" {
				sql = v.Source
			}
		}
		check(sql == filepath.Join(wd, "postgres", "deliver.sql"), "deliver-db-setup does not mount postgres/deliver.sql at /deliver.sql")
		check(strings.Contains(script, "-f /deliver.sql") && strings.Contains(script, "host="+consumerHost+" ") && strings.Contains(script, "sslmode=verify-full") && strings.Contains(script, "user=postgres"),
			"deliver-db-setup must run /deliver.sql as the superuser on %s over verify-full TLS: %s", consumerHost, script)
		check(strings.Contains(script, "ALTER ROLE jetinbox_deliver PASSWORD"), "deliver-db-setup does not set jetinbox_deliver's password")
		// grants.sql's REVOKE takes back the consumer's INSERT on
		// deliveries: deliver.sql runs after it, every time.
		check(g.DependsOn["db-grants"].Condition == composetypes.ServiceConditionCompletedSuccessfully, "deliver-db-setup must run after db-grants (grants.sql takes back what deliver.sql grants)")
	} else {
		check(false, "no deliver-db-setup service")
	}
}

// checkDeliverK8s: the dispatcher's Deployment (replicated, probed on
// /healthz, non-root with a read-only root, limits, jetinbox_deliver on
// the consumer's server from its own Secret, the signing secrets from
// another where endpoints.json names them, endpoints.json from its
// ConfigMap), its Service (scraped on the port it serves), its
// NetworkPolicy (PostgreSQL, DNS and HTTPS out, never NATS, the private
// ranges or the metadata address) and the kustomization.
func checkDeliverK8s(fsys files, k *k8sSet, checkSecure func(string, *corev1.PodSecurityContext, *corev1.SecurityContext), checkPodSecrets func(string, corev1.PodSpec) map[string]string) error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("kubernetes: "+format, args...))
		}
	}
	var d appsv1.Deployment
	var svc corev1.Service
	for name, v := range map[string]any{"kubernetes/deliver-deployment.yaml": &d, "kubernetes/deliver-service.yaml": &svc} {
		if err := decodeK8s(fsys, name, v); err != nil {
			return err
		}
	}
	check(d.APIVersion == "apps/v1" && d.Kind == "Deployment", "deliver-deployment.yaml is %s %s", d.APIVersion, d.Kind)
	check(svc.APIVersion == "v1" && svc.Kind == "Service", "deliver-service.yaml is %s %s", svc.APIVersion, svc.Kind)
	spec := d.Spec.Template.Spec
	labels := d.Spec.Template.Labels
	check(d.Spec.Replicas != nil && *d.Spec.Replicas >= 2, "deliver: run 2 or more replicas (they lease their own rows)")
	check(d.Spec.Selector != nil && labelsMatch(d.Spec.Selector.MatchLabels, labels), "deliver: selector does not match the pod labels")
	for _, other := range []appsv1.Deployment{k.deploy, k.relay, k.verify, k.intake, k.irelay} {
		check(!labelsMatch(other.Spec.Selector.MatchLabels, labels) && !labelsMatch(d.Spec.Selector.MatchLabels, other.Spec.Template.Labels), "deliver's selector and %s's take in each other's pods", other.Name)
	}
	check(len(svc.Spec.Selector) > 0 && labelsMatch(svc.Spec.Selector, labels) && !labelsMatch(svc.Spec.Selector, k.relay.Spec.Template.Labels) && !labelsMatch(svc.Spec.Selector, k.deploy.Spec.Template.Labels),
		"deliver Service must select the deliver pods alone")
	c, ok := findContainer(spec.Containers, "deliver")
	check(ok, "deliver: no container named deliver")
	var longest time.Duration
	if ok {
		args := slices.Concat(c.Command, c.Args)
		joined := strings.Join(args, " ")
		check(strings.HasPrefix(joined, "/usr/local/bin/jetinbox deliver "), "deliver runs %q, want jetinbox deliver", joined)
		port := ""
		for _, p := range c.Ports {
			if p.Name == "http" {
				port = strconv.Itoa(int(p.ContainerPort))
			}
		}
		check(port != "" && strings.Contains(joined, "-http 0.0.0.0:"+port), "deliver: -http must serve on the container port http %s of every interface (the default is loopback): %q", port, joined)
		check(svc.Annotations["prometheus.io/port"] == port && len(svc.Spec.Ports) == 1 && svc.Spec.Ports[0].TargetPort.String() == "http",
			"deliver Service must target port http and be scraped on %s (annotation %q)", port, svc.Annotations["prometheus.io/port"])
		check(c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path == "/healthz" && c.LivenessProbe.HTTPGet.Port.String() == "http",
			"deliver: liveness must probe /healthz on port http")
		e := envOf(c)
		for name := range e {
			check(!strings.HasPrefix(name, "NATS_"), "deliver: %s is set: the dispatcher talks to no NATS server", name)
		}
		u, err := url.Parse(e["DATABASE_URL"].Value)
		cu, _ := url.Parse(envOf(mustContainer(k.deploy, "consumer"))["DATABASE_URL"].Value)
		check(err == nil && u.User != nil && u.User.Username() == "jetinbox_deliver" && strings.Contains(u.RawQuery, "sslmode=verify-full"),
			"deliver must connect as jetinbox_deliver with sslmode=verify-full: %q", e["DATABASE_URL"].Value)
		check(err == nil && cu != nil && u.Host == cu.Host, "deliver connects to %q; the deliveries are in the consumer's database", e["DATABASE_URL"].Value)
		check(c.Resources.Limits.Memory().Sign() > 0 && c.Resources.Limits.Cpu().Sign() > 0, "deliver needs cpu and memory limits")
		check(c.Resources.Requests.Memory().Sign() > 0, "deliver needs a memory request")
		checkSecure("deliver", spec.SecurityContext, c.SecurityContext)

		// The endpoints file comes from its ConfigMap; its secret files
		// from the webhooks Secret, mounted where the file names them.
		var endpointsAt string
		for i, a := range args {
			if a == "-endpoints" && i+1 < len(args) {
				endpointsAt = args[i+1]
			}
		}
		mounts := map[string]string{} // volume -> mount path
		for _, m := range c.VolumeMounts {
			mounts[m.Name] = m.MountPath
			check(m.ReadOnly, "deliver: mount %s must be read-only", m.MountPath)
		}
		var cm, webhooks string
		for _, v := range spec.Volumes {
			if v.ConfigMap != nil && v.ConfigMap.Name == "jetinbox-deliver-endpoints" {
				cm = mounts[v.Name]
			}
			if v.Secret != nil && v.Secret.SecretName == "jetinbox-deliver-webhooks" {
				webhooks = mounts[v.Name]
			}
		}
		check(cm != "" && endpointsAt == path.Join(cm, "endpoints.json"), "deliver: -endpoints %q must be endpoints.json of the ConfigMap jetinbox-deliver-endpoints (made from %s)", endpointsAt, deliverEndpointsFile)
		keys := map[string]bool{}
		for key := range k.secrets["jetinbox-deliver-webhooks"].StringData {
			keys[key] = true
		}
		fx := fixture(nil)
		longest = checkDeliverEndpoints(fsys, webhooks, func(name string) (string, bool) {
			// Any generated secret stands in for the one you put there.
			return filepath.Join(fx.dir, "webhooks", "partner-1.secret"), keys[name]
		}, check)
	}
	check(spec.TerminationGracePeriodSeconds != nil && time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second > longest,
		"deliver: terminationGracePeriodSeconds must outlast a call (the longest endpoint timeout, %v)", longest)
	mounted := slices.Sorted(maps.Values(checkPodSecrets("deliver Deployment", spec)))
	check(slices.Equal(mounted, []string{"jetinbox-deliver-db", "jetinbox-deliver-webhooks"}), "deliver must mount jetinbox-deliver-db and jetinbox-deliver-webhooks alone, mounts %v", mounted)

	// Its NetworkPolicy.
	pols, err := networkPolicies(fsys, "kubernetes/networkpolicy.yaml", check)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	var selected []networkingv1.NetworkPolicy
	for _, p := range pols {
		if len(p.Spec.PodSelector.MatchLabels) > 0 && labelsMatch(p.Spec.PodSelector.MatchLabels, labels) {
			selected = append(selected, p)
		}
	}
	check(len(selected) == 1, "deliver pods are selected by %d policies, want 1", len(selected))
	if len(selected) == 1 {
		pol := selected[0]
		pol.Namespace = "jetinbox"
		check(slices.Contains(pol.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) && slices.Contains(pol.Spec.PolicyTypes, networkingv1.PolicyTypeEgress),
			"deliver: policyTypes %v, want Ingress and Egress", pol.Spec.PolicyTypes)
		bad := func(format string, args ...any) { check(false, "deliver: "+format, args...) }
		for _, w := range []struct {
			p     peer
			ports []string
		}{
			{peer{"prometheus", "monitoring", map[string]string{"app.kubernetes.io/name": "prometheus"}}, []string{"TCP/http"}},
			{peer{"the consumer", "jetinbox", k.deploy.Spec.Template.Labels}, nil},
			{peer{"a pod of another namespace", "default", map[string]string{"app": "x"}}, nil},
		} {
			got := admittedPorts(pol, w.p, bad)
			check(maps.Equal(got, setOf(w.ports)), "deliver: %s may reach %v, want %v", w.p.name, slices.Sorted(maps.Keys(got)), w.ports)
		}
		allowed := map[string]bool{"TCP/5432": true, "UDP/53": true, "TCP/53": true, "TCP/443": true}
		seen := map[string]bool{}
		for _, r := range pol.Spec.Egress {
			check(len(r.To) > 0 && len(r.Ports) > 0, "deliver: an egress rule without to or ports")
			https := false
			for _, p := range r.Ports {
				proto := corev1.ProtocolTCP
				if p.Protocol != nil {
					proto = *p.Protocol
				}
				key := fmt.Sprintf("%s/%s", proto, p.Port)
				check(p.Port != nil && allowed[key], "deliver: egress to %s, want only PostgreSQL 5432, DNS 53 and HTTPS 443", key)
				seen[key] = true
				https = https || key == "TCP/443"
			}
			for _, to := range r.To {
				if to.IPBlock == nil {
					check(!https, "deliver: HTTPS to in-cluster pods by selector: name receivers by address")
					continue
				}
				// Receivers are out there; the pods, nodes and the cloud's
				// metadata service are not.
				for _, private := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8"} {
					check(to.IPBlock.CIDR != "0.0.0.0/0" || slices.Contains(to.IPBlock.Except, private), "deliver: egress to 0.0.0.0/0 does not except %s", private)
				}
				check(https, "deliver: an IP block reached on a port other than 443")
			}
		}
		for key := range allowed {
			check(seen[key], "deliver: no egress to %s", key)
		}
	}

	var kust struct {
		Resources []string `json:"resources"`
	}
	if b, err := fsys.get("kubernetes/kustomization.yaml"); err != nil {
		errs = append(errs, err)
	} else if err := yaml.Unmarshal(b, &kust); err != nil {
		errs = append(errs, fmt.Errorf("kubernetes/kustomization.yaml: %w", err))
	}
	for _, f := range []string{"deliver-deployment.yaml", "deliver-service.yaml"} {
		check(slices.Contains(kust.Resources, f), "kustomization.yaml does not apply %s", f)
	}
	// The Kubernetes steps make what the Deployment mounts, and the role.
	if readme, err := fsys.get("README.md"); err == nil {
		for _, step := range []string{
			"kubectl -n jetinbox create secret generic jetinbox-deliver-db ",
			"kubectl -n jetinbox create secret generic jetinbox-deliver-webhooks ",
			"kubectl -n jetinbox create configmap jetinbox-deliver-endpoints --from-file=endpoints.json=",
			"-f deploy/postgres/deliver.sql",
			"kubectl -n jetinbox rollout status deploy/" + d.Name + "\n",
		} {
			check(strings.Contains(string(readme), step), "README.md's Kubernetes steps do not run %q", strings.TrimSpace(step))
		}
		for key := range k.secrets["jetinbox-deliver-webhooks"].StringData {
			check(strings.Contains(string(readme), "--from-file="+key+"="), "README.md's Kubernetes steps do not fill jetinbox-deliver-webhooks' key %s", key)
		}
	}
	return errors.Join(errs...)
}

func mustContainer(d appsv1.Deployment, name string) corev1.Container {
	c, _ := findContainer(d.Spec.Template.Spec.Containers, name)
	return c
}

// validateDeliverDashboard: the dashboard's Deliveries row shows every
// metric the dispatcher exports, each selecting the dispatcher's job
// through the variable deliver_job (made from a metric only the dispatcher
// exports), never the consumer's $job.
func validateDeliverDashboard(fsys files) error {
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
	variable := false
	for _, v := range d.Templating.List {
		if v.Name == "deliver_job" {
			variable = strings.HasPrefix(v.Definition, "label_values(jetinbox_delivery_") && strings.HasSuffix(v.Definition, ", job)")
		}
	}
	check(variable, "no variable deliver_job from label_values(jetinbox_delivery_…, job)")
	shown := map[string]bool{}
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			expr, err := promQL.ParseExpr(grafanaVars.Replace(t.Expr))
			if err != nil {
				check(false, "panel %q: %v", p.Title, err)
				continue
			}
			for m := range metricsIn(expr) {
				if strings.HasPrefix(m, "jetinbox_delivery_") {
					shown[m] = true
					check(strings.Contains(t.Expr, `job=~"$deliver_job"`) && !strings.Contains(t.Expr, `"$job"`), "panel %q: %s must select the dispatcher's job ($deliver_job): %s", p.Title, m, t.Expr)
				}
			}
		}
	}
	for _, m := range []string{"jetinbox_delivery_attempts_total", "jetinbox_delivery_dead_letters_total", "jetinbox_delivery_oldest_pending_seconds", "jetinbox_delivery_pending_rows", "jetinbox_delivery_breaker_state", "jetinbox_delivery_call_seconds"} {
		check(shown[m], "no panel shows %s", m)
	}
	return errors.Join(errs...)
}

func TestGrafanaDeliveries(t *testing.T) {
	t.Parallel()
	fsys := loadFiles(t)
	if err := validateDeliverDashboard(fsys); err != nil {
		t.Fatal(err)
	}
	if err := validateDashboard(fsys); err != nil {
		t.Fatal(err)
	}
	// And it can fail.
	if validateDeliverDashboard(fsys.with(t, "grafana/jetinbox-dashboard.json", `jetinbox_delivery_breaker_state{job=~\"$deliver_job\"}`, `jetinbox_delivery_breaker_state{job=~\"$job\"}`)) == nil {
		t.Fatal("a breaker panel on the consumer's job was accepted")
	}
}
