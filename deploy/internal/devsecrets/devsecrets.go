// Package devsecrets makes the throwaway credentials a development stack
// needs: a private CA with server and client certificates, one nkey per NATS
// user, the NATS auth file carrying their public keys, and PostgreSQL
// passwords with matching pgpass files, the HTTP intake's tenants file, and
// the delivery dispatcher's webhook signing secrets.
//
// It is for compose on a laptop and for the deploy tests, never for
// production: the CA key is thrown away. The files are the generating
// user's alone (0600 in 0700 directories, also when -force writes over an
// earlier run); the compose stack hands each container its own copy (see
// compose.yaml's secrets-init). Production certificates come from your PKI
// and nkey seed files from `nk -gen user`; see deploy/README.md.
package devsecrets

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/nats-io/nkeys"
)

// Users are the NATS users of deploy/nats/auth.conf, by the prefix of the
// variable that holds each one's public nkey there (PRODUCER_NKEY, …).
var Users = []string{"producer", "consumer", "relay", "verify", "admin", "sys"}

// DBRoles are the PostgreSQL login roles of deploy/postgres/roles.sql that
// get a password and a pgpass file.
var DBRoles = []string{"jetinbox_migrator", "jetinbox_consumer", "jetinbox_relay", "jetinbox_verifier", "jetinbox_maintainer"}

// IntakeRole is the HTTP intake's login role (deploy/postgres/intake.sql).
// It gets a password and a pgpass file for the intake's own database.
const IntakeRole = "jetinbox_intake"

// IntakeDBRoles are the roles that log in to the intake's own database
// (its own server, with roles.sql and intake.sql, never the consumer's
// database: a relay takes every pending row of its outbox): the migrator
// (`jetinbox intake -migrate`), the relay that publishes the intake's
// outbox into INTENTS, the maintainer (`jetinbox intake -prune`) and the
// intake. Each gets postgres/intake/ROLE.pgpass naming that server.
var IntakeDBRoles = []string{"jetinbox_migrator", "jetinbox_relay", "jetinbox_maintainer", IntakeRole}

// DeliverRole is the delivery dispatcher's login role
// (deploy/postgres/deliver.sql, `jetinbox deliver`). It gets a password and
// a pgpass file for the consumer's database, where the deliveries are.
const DeliverRole = "jetinbox_deliver"

// WebhookSecrets are the signing secrets of the example endpoint in
// deploy/deliver/endpoints.json, Standard Webhooks style ("whsec_" and
// base64 of 32 random bytes): two, as during a rotation, when every
// request carries a signature by each.
var WebhookSecrets = []string{"webhooks/partner-1.secret", "webhooks/partner-2.secret"}

// IntakeTenant is the tenant of the development tenants file.
const IntakeTenant = "dev"

// Options says what to generate. The zero value of each field but Dir and
// AuthTemplate has a usable default.
type Options struct {
	// Dir receives everything; it is created if missing.
	Dir string
	// AuthTemplate is the content of deploy/nats/auth.conf; its public keys
	// are replaced by the generated users' keys into Dir/nats-auth.conf.
	AuthTemplate []byte
	// NATSHosts are the DNS names and IPs of the NATS server certificate.
	// Default: nats, nats-1, nats-2, nats-3, localhost, 127.0.0.1, ::1.
	NATSHosts []string
	// PostgresHosts are the names of the PostgreSQL server certificate.
	// Default: postgres, intake-postgres, localhost, 127.0.0.1, ::1.
	PostgresHosts []string
	// PGHost, PGPort and PGDatabase go into the pgpass files. Defaults:
	// postgres, 5432, jetinbox.
	PGHost     string
	PGPort     int
	PGDatabase string
	// IntakePGHost is the intake's own PostgreSQL server, for the pgpass
	// files of IntakeDBRoles (port PGPort, database PGDatabase). Default:
	// intake-postgres.
	IntakePGHost string
	// Validity of every certificate. Default 90 days.
	Validity time.Duration
}

// Result names what Generate wrote and the public keys it made.
type Result struct {
	// Files are the written paths relative to Dir, in the order written.
	Files []string
	// PublicKeys maps each of Users to its public nkey.
	PublicKeys map[string]string
}

// Generate writes the development secrets into opts.Dir.
func Generate(opts Options) (*Result, error) {
	if opts.Dir == "" {
		return nil, errors.New("devsecrets: Dir is required")
	}
	if len(opts.AuthTemplate) == 0 {
		return nil, errors.New("devsecrets: AuthTemplate is required")
	}
	if opts.NATSHosts == nil {
		opts.NATSHosts = []string{"nats", "nats-1", "nats-2", "nats-3", "localhost", "127.0.0.1", "::1"}
	}
	if opts.PostgresHosts == nil {
		opts.PostgresHosts = []string{"postgres", "intake-postgres", "localhost", "127.0.0.1", "::1"}
	}
	if opts.PGHost == "" {
		opts.PGHost = "postgres"
	}
	if opts.IntakePGHost == "" {
		opts.IntakePGHost = "intake-postgres"
	}
	if opts.PGPort == 0 {
		opts.PGPort = 5432
	}
	if opts.PGDatabase == "" {
		opts.PGDatabase = "jetinbox"
	}
	if opts.Validity == 0 {
		opts.Validity = 90 * 24 * time.Hour
	}
	w := &writer{dir: opts.Dir}
	res := &Result{PublicKeys: map[string]string{}}

	ca, err := newCA(opts.Validity)
	if err != nil {
		return nil, err
	}
	w.pem("tls/ca.pem", "CERTIFICATE", ca.der)
	leaves := []struct {
		name  string
		hosts []string
		usage []x509.ExtKeyUsage
	}{
		// NATS servers present this one to clients and to each other on
		// routes, so it is both a server and a client certificate.
		{"nats-server", opts.NATSHosts, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}},
		{"postgres", opts.PostgresHosts, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
		{"producer", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"consumer", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"relay", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"verify", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"admin", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		// The HTTP intake's server certificate (jetinbox intake -tls-cert).
		{"intake", []string{"intake", "localhost", "127.0.0.1", "::1"}, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
	}
	for _, l := range leaves {
		certDER, keyDER, err := ca.issue(l.name, l.hosts, l.usage, opts.Validity)
		if err != nil {
			return nil, err
		}
		w.pem("tls/"+l.name+".pem", "CERTIFICATE", certDER)
		w.pem("tls/"+l.name+"-key.pem", "PRIVATE KEY", keyDER)
	}

	for _, u := range Users {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("devsecrets: nkey: %w", err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, fmt.Errorf("devsecrets: nkey: %w", err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("devsecrets: nkey: %w", err)
		}
		w.file("nkeys/"+u+".nk", append(seed, '\n'))
		res.PublicKeys[u] = pub
	}
	auth, err := RenderAuth(opts.AuthTemplate, res.PublicKeys)
	if err != nil {
		return nil, err
	}
	w.file("nats-auth.conf", auth)

	passwords := map[string]string{}
	for _, role := range append([]string{"postgres"}, DBRoles...) {
		pw := rand.Text()
		passwords[role] = pw
		w.file("postgres/"+role+".password", []byte(pw))
		if role != "postgres" {
			line := fmt.Sprintf("%s:%d:%s:%s:%s\n", opts.PGHost, opts.PGPort, opts.PGDatabase, role, pw)
			w.file("postgres/"+role+".pgpass", []byte(line))
		}
	}
	// The intake's own server: the same roles with the same passwords (its
	// initdb sets them from the same files), and the intake's.
	passwords[IntakeRole] = rand.Text()
	w.file("postgres/"+IntakeRole+".password", []byte(passwords[IntakeRole]))
	for _, role := range IntakeDBRoles {
		line := fmt.Sprintf("%s:%d:%s:%s:%s\n", opts.IntakePGHost, opts.PGPort, opts.PGDatabase, role, passwords[role])
		w.file("postgres/intake/"+role+".pgpass", []byte(line))
	}
	// The dispatcher's role on the consumer's server, and its signing
	// secrets.
	passwords[DeliverRole] = rand.Text()
	w.file("postgres/"+DeliverRole+".password", []byte(passwords[DeliverRole]))
	w.file("postgres/"+DeliverRole+".pgpass", fmt.Appendf(nil, "%s:%d:%s:%s:%s\n", opts.PGHost, opts.PGPort, opts.PGDatabase, DeliverRole, passwords[DeliverRole]))
	for _, f := range WebhookSecrets {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("devsecrets: %w", err)
		}
		w.file(f, []byte("whsec_"+base64.StdEncoding.EncodeToString(key)+"\n"))
	}
	// The intake's tenants file: one tenant, its bearer token beside it
	// (for curl), the file holding only the token's SHA-256.
	token := rand.Text()
	sum := sha256.Sum256([]byte(token))
	w.file("intake/token", []byte(token))
	tenants := fmt.Sprintf(`{"tenants": [{"name": %q, "token_sha256": %q, "subjects": "intents."}]}`+"\n", IntakeTenant, hex.EncodeToString(sum[:]))
	w.file("intake/tenants.json", []byte(tenants))
	if w.err != nil {
		return nil, w.err
	}
	res.Files = w.files
	return res, nil
}

var nkeyVar = regexp.MustCompile(`(?m)^([A-Z]+)_NKEY:\s*"(U[A-Z2-7]{55})"`)

// RenderAuth returns the auth template with the public key of each user in
// keys (by lower-case name, see Users) put in place of the template's. It
// fails if the template lacks a user or keys lacks one of the template's.
func RenderAuth(template []byte, keys map[string]string) ([]byte, error) {
	seen := map[string]bool{}
	var missing error
	out := nkeyVar.ReplaceAllFunc(template, func(m []byte) []byte {
		sub := nkeyVar.FindSubmatch(m)
		name := string(bytes.ToLower(sub[1]))
		seen[name] = true
		k, ok := keys[name]
		if !ok {
			missing = fmt.Errorf("devsecrets: no key for %s_NKEY", sub[1])
			return m
		}
		return bytes.Replace(m, sub[2], []byte(k), 1)
	})
	if missing != nil {
		return nil, missing
	}
	for name := range keys {
		if !seen[name] {
			return nil, fmt.Errorf("devsecrets: the auth template has no %s public key line", name)
		}
	}
	return out, nil
}

type writer struct {
	dir   string
	files []string
	err   error
}

func (w *writer) file(rel string, data []byte) {
	if w.err != nil {
		return
	}
	p := filepath.Join(w.dir, filepath.FromSlash(rel))
	// Every directory from Dir down to the file's is the user's alone, and
	// so is the file: a directory or file an earlier run (or another tool)
	// left more open is closed too, since MkdirAll and WriteFile keep the
	// mode of what exists.
	for d := filepath.Dir(rel); ; d = filepath.Dir(d) {
		dir := filepath.Join(w.dir, filepath.FromSlash(d))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			w.err = fmt.Errorf("devsecrets: %w", err)
			return
		}
		if err := os.Chmod(dir, 0o700); err != nil {
			w.err = fmt.Errorf("devsecrets: %w", err)
			return
		}
		if d == "." {
			break
		}
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		w.err = fmt.Errorf("devsecrets: %w", err)
		return
	}
	if err := os.Chmod(p, 0o600); err != nil {
		w.err = fmt.Errorf("devsecrets: %w", err)
		return
	}
	w.files = append(w.files, rel)
}

func (w *writer) pem(rel, typ string, der []byte) {
	w.file(rel, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
}

func newCA(validity time.Duration) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("devsecrets: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "jetinbox development CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("devsecrets: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("devsecrets: %w", err)
	}
	return &authority{cert: cert, key: key, der: der}, nil
}

func (ca *authority) issue(cn string, hosts []string, usage []x509.ExtKeyUsage, validity time.Duration) (certDER, keyDER []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("devsecrets: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	certDER, err = x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("devsecrets: %w", err)
	}
	keyDER, err = x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("devsecrets: %w", err)
	}
	return certDER, keyDER, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return n
}
