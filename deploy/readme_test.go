package deploy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// validateReadme checks the operator steps of README.md against the files:
// the Kubernetes steps apply every stream and consumer definition, the
// advisory stream and the rescue consumer first, each to its stream, from
// the one-off admin pod, and the NATS servers' network policy.
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
	// The admin's seed is in the cluster only for the task: no nats-box,
	// the one-off pod and its Secret deleted after the commands.
	check(!strings.Contains(readme, "deploy/nats-box"), "the Kubernetes steps run admin commands in nats-box, which keeps the admin's seed in a long-running pod")
	check(strings.Contains(readme, "kubectl -n nats apply -f deploy/kubernetes/nats-admin-pod.yaml\n"), "the Kubernetes steps do not start the one-off admin pod")
	check(strings.Contains(readme, "kubectl -n nats delete pod/nats-admin secret/nats-admin\n"), "the Kubernetes steps do not delete the admin pod and its Secret after the admin's commands")
	check(strings.Contains(readme, "kubectl -n nats apply -f deploy/kubernetes/nats-networkpolicy.yaml\n"), "the Kubernetes steps do not apply the NATS servers' network policy")
	return errors.Join(errs...)
}

func TestReadme(t *testing.T) {
	if err := validateReadme(loadFiles(t)); err != nil {
		t.Fatal(err)
	}
}
