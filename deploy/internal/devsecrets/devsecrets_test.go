package devsecrets_test

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/jetinbox/jetinbox/deploy/internal/devsecrets"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestGenerate(t *testing.T) {
	tmpl, err := os.ReadFile("../../nats/auth.conf")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	res, err := devsecrets.Generate(devsecrets.Options{Dir: dir, AuthTemplate: tmpl})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(readCert(t, filepath.Join(dir, "tls", "ca.pem")))
	verify := func(name, host string, usage x509.ExtKeyUsage) {
		t.Helper()
		c := readCert(t, filepath.Join(dir, "tls", name+".pem"))
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("%s for %q: %v", name, host, err)
		}
	}
	for _, h := range []string{"nats-1", "nats-2", "nats-3", "localhost", "127.0.0.1"} {
		verify("nats-server", h, x509.ExtKeyUsageServerAuth)
	}
	// Routes: a server's certificate is also its client certificate.
	verify("nats-server", "", x509.ExtKeyUsageClientAuth)
	verify("postgres", "postgres", x509.ExtKeyUsageServerAuth)
	for _, u := range []string{"producer", "consumer", "verify", "admin"} {
		verify(u, "", x509.ExtKeyUsageClientAuth)
		c := readCert(t, filepath.Join(dir, "tls", u+".pem"))
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
			t.Errorf("client certificate %s also works as a server certificate", u)
		}
	}

	auth, err := os.ReadFile(filepath.Join(dir, "nats-auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range devsecrets.Users {
		seed, err := os.ReadFile(filepath.Join(dir, "nkeys", u+".nk"))
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
		if err != nil {
			t.Fatalf("%s seed: %v", u, err)
		}
		pub, _ := kp.PublicKey()
		if pub != res.PublicKeys[u] || !bytes.Contains(auth, []byte(strings.ToUpper(u)+`_NKEY: "`+pub+`"`)) {
			t.Errorf("nats-auth.conf does not carry %s's public key %s", u, pub)
		}
		if bytes.Contains(auth, seed[:10]) {
			t.Errorf("nats-auth.conf contains %s's seed", u)
		}
	}
	// Everything but the keys is the template's.
	if len(auth) != len(tmpl) {
		t.Errorf("rendered auth differs from the template in more than the keys")
	}
	for _, role := range devsecrets.DBRoles {
		pgpass, err := os.ReadFile(filepath.Join(dir, "postgres", role+".pgpass"))
		if err != nil {
			t.Fatal(err)
		}
		pw, _ := os.ReadFile(filepath.Join(dir, "postgres", role+".password"))
		if want := "postgres:5432:jetinbox:" + role + ":" + string(pw) + "\n"; string(pgpass) != want {
			t.Errorf("%s pgpass %q, want %q", role, pgpass, want)
		}
	}
	// The intake's own server: the same passwords, its host.
	for _, role := range devsecrets.IntakeDBRoles {
		pgpass, err := os.ReadFile(filepath.Join(dir, "postgres", "intake", role+".pgpass"))
		if err != nil {
			t.Fatal(err)
		}
		pw, err := os.ReadFile(filepath.Join(dir, "postgres", role+".password"))
		if err != nil || len(pw) == 0 {
			t.Fatalf("%s password: %q %v", role, pw, err)
		}
		if want := "intake-postgres:5432:jetinbox:" + role + ":" + string(pw) + "\n"; string(pgpass) != want {
			t.Errorf("intake %s pgpass %q, want %q", role, pgpass, want)
		}
	}
	if cert := readCert(t, filepath.Join(dir, "tls", "postgres.pem")); !slices.Contains(cert.DNSNames, "intake-postgres") {
		t.Errorf("the PostgreSQL certificate names %v, not the intake's server intake-postgres", cert.DNSNames)
	}
	// The tenants file holds the token's SHA-256, never the token.
	token, err := os.ReadFile(filepath.Join(dir, "intake", "token"))
	if err != nil {
		t.Fatal(err)
	}
	tenants, err := os.ReadFile(filepath.Join(dir, "intake", "tenants.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		Tenants []struct {
			Name        string `json:"name"`
			TokenSHA256 string `json:"token_sha256"`
			Subjects    string `json:"subjects"`
		} `json:"tenants"`
	}
	if err := json.Unmarshal(tenants, &tf); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(token)
	if len(tf.Tenants) != 1 || tf.Tenants[0].TokenSHA256 != hex.EncodeToString(sum[:]) || tf.Tenants[0].Subjects != "intents." || len(token) < 20 {
		t.Errorf("tenants.json %s does not hold the SHA-256 of the token beside it", tenants)
	}
	if bytes.Contains(tenants, token) {
		t.Errorf("tenants.json contains the token")
	}
}

func TestRenderAuthRefusesAMismatch(t *testing.T) {
	tmpl := []byte("PRODUCER_NKEY: \"UDFQCVJVI6576LPYI6RTAUL344LGMQFF6X66ZNTNUQRSZOI5IZNW6YTE\"\n")
	if _, err := devsecrets.RenderAuth(tmpl, map[string]string{"producer": "UX", "consumer": "UY"}); err == nil {
		t.Error("a key without a line in the template was accepted")
	}
	if _, err := devsecrets.RenderAuth(tmpl, map[string]string{}); err == nil {
		t.Error("a template line without a key was accepted")
	}
}

// TestFilesAreTheUsersAlone: every file Generate writes is 0600 and every
// directory 0700, also when it writes over a directory an earlier run (or
// another tool) left open to others.
func TestFilesAreTheUsersAlone(t *testing.T) {
	tmpl, err := os.ReadFile("../../nats/auth.conf")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "secrets")
	// What an earlier version left: everything readable by all.
	for _, d := range []string{dir, filepath.Join(dir, "tls"), filepath.Join(dir, "postgres")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "tls", "ca.pem"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "tls", "ca.pem"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := devsecrets.Generate(devsecrets.Options{Dir: dir, AuthTemplate: tmpl})
	if err != nil {
		t.Fatal(err)
	}
	var files, dirs int
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
			dirs++
		} else {
			files++
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files != len(res.Files) || dirs < 4 {
		t.Errorf("walked %d files and %d directories, Generate wrote %d files", files, dirs, len(res.Files))
	}
	for _, role := range devsecrets.DBRoles {
		if !slices.Contains(res.Files, "postgres/"+role+".pgpass") {
			t.Errorf("no pgpass file for %s", role)
		}
	}
}
