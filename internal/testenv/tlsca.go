package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestCA is a certificate authority for tests: it issues server
// certificates for 127.0.0.1 and client certificates, valid for an hour,
// and writes them as PEM files under its own temporary directory.
type TestCA struct {
	t      testing.TB
	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial atomic.Int64
	// File is the CA certificate's PEM file.
	File string
	// Pool holds the CA certificate.
	Pool *x509.CertPool
}

// NewTestCA makes a CA named name.
func NewTestCA(t testing.TB, name string) *TestCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &TestCA{t: t, dir: t.TempDir(), cert: cert, key: key, Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	ca.serial.Store(1)
	ca.File = ca.write("ca.pem", "CERTIFICATE", der)
	return ca
}

// Server issues a certificate for 127.0.0.1 and returns its PEM files.
func (ca *TestCA) Server(name string) (certFile, keyFile string) {
	return ca.issue(name, x509.ExtKeyUsageServerAuth)
}

// Client issues a client certificate and returns its PEM files.
func (ca *TestCA) Client(name string) (certFile, keyFile string) {
	return ca.issue(name, x509.ExtKeyUsageClientAuth)
}

// ClientTLS is a client certificate ready for a tls.Config.
func (ca *TestCA) ClientTLS(name string) tls.Certificate {
	c, k := ca.Client(name)
	pair, err := tls.LoadX509KeyPair(c, k)
	if err != nil {
		ca.t.Fatal(err)
	}
	return pair
}

func (ca *TestCA) issue(name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	ca.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		ca.t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		ca.t.Fatal(err)
	}
	return ca.write(name+".pem", "CERTIFICATE", der), ca.write(name+"-key.pem", "EC PRIVATE KEY", keyDER)
}

func (ca *TestCA) write(name, typ string, der []byte) string {
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return p
}

// ServerTLS is a server's tls.Config holding a certificate for 127.0.0.1.
func (ca *TestCA) ServerTLS(name string) *tls.Config {
	c, k := ca.Server(name)
	pair, err := tls.LoadX509KeyPair(c, k)
	if err != nil {
		ca.t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}
