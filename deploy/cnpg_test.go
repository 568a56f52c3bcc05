package deploy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The CloudNativePG types are not a module the deploy tests may pull in:
// these are the fields the manifest sets, decoded strictly, so that a typo
// or a field moved elsewhere fails here instead of being dropped by the
// operator.
type cnpgMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

type cnpgCluster struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   cnpgMeta `json:"metadata"`
	Spec       struct {
		Instances       int `json:"instances"`
		MinSyncReplicas int `json:"minSyncReplicas"`
		MaxSyncReplicas int `json:"maxSyncReplicas"`
		PostgreSQL      struct {
			Parameters map[string]string `json:"parameters"`
		} `json:"postgresql"`
		Bootstrap struct {
			InitDB struct {
				Database string `json:"database"`
				Owner    string `json:"owner"`
			} `json:"initdb"`
		} `json:"bootstrap"`
		Storage struct {
			Size string `json:"size"`
		} `json:"storage"`
	} `json:"spec"`
}

type cnpgPooler struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   cnpgMeta `json:"metadata"`
	Spec       struct {
		Cluster struct {
			Name string `json:"name"`
		} `json:"cluster"`
		Instances int    `json:"instances"`
		Type      string `json:"type"`
		PgBouncer struct {
			PoolMode   string            `json:"poolMode"`
			Parameters map[string]string `json:"parameters"`
		} `json:"pgbouncer"`
	} `json:"spec"`
}

func validateCNPG(fsys files) error {
	b, err := fsys.get("kubernetes/postgres-cnpg.yaml")
	if err != nil {
		return err
	}
	docs := splitYAML(b)
	if len(docs) != 2 {
		return fmt.Errorf("postgres-cnpg.yaml: %d documents, want a Cluster and a Pooler", len(docs))
	}
	var c cnpgCluster
	var p cnpgPooler
	if err := yaml.UnmarshalStrict(docs[0], &c); err != nil {
		return fmt.Errorf("postgres-cnpg.yaml Cluster: %w", err)
	}
	if err := yaml.UnmarshalStrict(docs[1], &p); err != nil {
		return fmt.Errorf("postgres-cnpg.yaml Pooler: %w", err)
	}
	var errs []error
	check := func(ok bool, format string, a ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("postgres-cnpg.yaml: "+format, a...))
		}
	}
	check(c.APIVersion == "postgresql.cnpg.io/v1" && c.Kind == "Cluster", "first document is %s %s, want postgresql.cnpg.io/v1 Cluster", c.APIVersion, c.Kind)
	check(p.APIVersion == "postgresql.cnpg.io/v1" && p.Kind == "Pooler", "second document is %s %s, want postgresql.cnpg.io/v1 Pooler", p.APIVersion, p.Kind)
	check(c.Metadata.Namespace == "jetinbox" && p.Metadata.Namespace == "jetinbox", "namespaces %q, %q, want jetinbox", c.Metadata.Namespace, p.Metadata.Namespace)
	// An acked message's effect must survive a failover: a standby has
	// every commit, and one standby may be away without stopping commits.
	check(c.Spec.MinSyncReplicas >= 1, "minSyncReplicas %d: without a synchronous standby a failover loses acked commits", c.Spec.MinSyncReplicas)
	check(c.Spec.MaxSyncReplicas >= c.Spec.MinSyncReplicas, "maxSyncReplicas %d below minSyncReplicas %d", c.Spec.MaxSyncReplicas, c.Spec.MinSyncReplicas)
	check(c.Spec.Instances-1 > c.Spec.MaxSyncReplicas, "instances %d: want more standbys than maxSyncReplicas %d, so that one may be down while commits go on", c.Spec.Instances, c.Spec.MaxSyncReplicas)
	if v, ok := c.Spec.PostgreSQL.Parameters["synchronous_commit"]; ok {
		check(v == "on" || v == "remote_write" || v == "remote_apply", "synchronous_commit %q does not wait for the standby", v)
	}
	check(c.Spec.Bootstrap.InitDB.Owner == "jetinbox_migrator", "database owner %q, want jetinbox_migrator (the role that owns the schema, roles.sql)", c.Spec.Bootstrap.InitDB.Owner)
	check(p.Spec.Cluster.Name == c.Metadata.Name, "the Pooler serves cluster %q, not %q", p.Spec.Cluster.Name, c.Metadata.Name)
	check(p.Spec.Type == "rw", "the Pooler's type %q: clients write, want rw", p.Spec.Type)
	check(p.Spec.PgBouncer.PoolMode == "transaction", "poolMode %q, want transaction (what the consumer is tested through)", p.Spec.PgBouncer.PoolMode)
	check(p.Spec.Instances >= 2, "%d pooler instances: one is a single point of failure", p.Spec.Instances)
	return errors.Join(errs...)
}

func TestCloudNativePGManifest(t *testing.T) {
	if err := validateCNPG(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}

// TestCloudNativePGManifestChecks: the checks catch what they are for.
func TestCloudNativePGManifestChecks(t *testing.T) {
	fsys := loadFiles(t)
	orig := string(fsys["kubernetes/postgres-cnpg.yaml"])
	for _, m := range []struct{ from, to string }{
		{"  minSyncReplicas: 1", "  minSyncReplicas: 0"},
		{"poolMode: transaction", "poolMode: session"},
		{"  type: rw", "  type: ro"},
		{"  minSyncReplicas: 1", "  minSyncReplica: 1"},
		{`synchronous_commit: "on"`, `synchronous_commit: "local"`},
	} {
		mut := files{}
		for k, v := range fsys {
			mut[k] = v
		}
		if !strings.Contains(orig, m.from) {
			t.Fatalf("%q not in the manifest", m.from)
		}
		mut["kubernetes/postgres-cnpg.yaml"] = []byte(strings.Replace(orig, m.from, m.to, 1))
		if err := validateCNPG(mut); err == nil {
			t.Errorf("%q → %q passed", m.from, m.to)
		}
	}
}
