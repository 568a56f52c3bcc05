package devsecrets_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/delivery"
	"github.com/jetinbox/jetinbox/deploy/internal/devsecrets"
)

// TestGenerateDeliver: the dispatcher's password with a pgpass file naming
// the consumer's server, and two distinct signing secrets the dispatcher
// reads.
func TestGenerateDeliver(t *testing.T) {
	t.Parallel()
	tmpl, err := os.ReadFile("../../nats/auth.conf")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := devsecrets.Generate(devsecrets.Options{Dir: dir, AuthTemplate: tmpl}); err != nil {
		t.Fatal(err)
	}
	pw, err := os.ReadFile(filepath.Join(dir, "postgres", devsecrets.DeliverRole+".password"))
	if err != nil {
		t.Fatal(err)
	}
	pgpass, err := os.ReadFile(filepath.Join(dir, "postgres", devsecrets.DeliverRole+".pgpass"))
	if want := "postgres:5432:jetinbox:" + devsecrets.DeliverRole + ":" + string(pw) + "\n"; err != nil || string(pgpass) != want {
		t.Errorf("deliver pgpass %q (%v), want %q", pgpass, err, want)
	}
	var keys [][]byte
	for _, f := range devsecrets.WebhookSecrets {
		p := filepath.Join(dir, filepath.FromSlash(f))
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
		}
		k, err := delivery.ParseSecret(strings.TrimSpace(string(b)))
		if err != nil || !strings.HasPrefix(string(b), "whsec_") || len(k) != 32 {
			t.Fatalf("%s: %q: %d bytes, %v", f, b, len(k), err)
		}
		keys = append(keys, k)
	}
	if len(keys) != 2 || bytes.Equal(keys[0], keys[1]) {
		t.Errorf("want two distinct secrets, have %d", len(keys))
	}
}
