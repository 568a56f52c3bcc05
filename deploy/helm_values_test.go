package deploy_test

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetinbox/jetinbox/inbox/jsinbox"
)

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
			Creds chartKeyFile `json:"creds"`
			Nkey  chartKeyFile `json:"nkey"`
			TLS   struct {
				SecretName string `json:"secretName"`
			} `json:"tls"`
		} `json:"contexts,omitempty"`
	} `json:"natsBox"`
}

// chartKeyFile is a nats-box context's creds or nkey: the file's contents
// in the values, or a Secret holding it.
type chartKeyFile struct {
	Contents   string `json:"contents,omitempty"`
	SecretName string `json:"secretName,omitempty"`
	Key        string `json:"key,omitempty"`
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
	// The chart's nats-box is a Deployment: a seed in its context would be
	// online around the clock. Admin commands run from the one-off
	// nats-admin-pod.yaml instead.
	check(!v.NatsBox.Enabled, "natsBox must stay disabled: it would keep a NATS seed in a long-running pod (use nats-admin-pod.yaml)")
	for name, c := range v.NatsBox.Contexts {
		check(c.Nkey == chartKeyFile{} && c.Creds == chartKeyFile{}, "natsBox context %q holds a seed (nkey or creds); keep seeds out of the values", name)
	}
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
		check(opts.MaxPayload >= jsinbox.DefaultMaxMsgSize+jsinbox.DeadLetterHeadroom && opts.MaxPayload <= 64<<10,
			"rendered config: max_payload %d, want room for a dead letter (%d) and at most 64KB", opts.MaxPayload, jsinbox.DefaultMaxMsgSize+jsinbox.DeadLetterHeadroom)
	}
	return errors.Join(errs...)
}

func TestHelmValues(t *testing.T) {
	fx := fixture(t)
	if err := validateHelmValues(loadFiles(t), filepath.Join(fx.dir, "tls")); err != nil {
		t.Fatal(err)
	}
}
