package delivery

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// Endpoint is a receiver the dispatcher calls. Endpoints come only from
// configuration (an endpoints file), never from a message: an intent
// names an endpoint, it cannot carry a URL.
type Endpoint struct {
	// Name is how intents and routes refer to the endpoint: 1 to 64
	// letters, digits, '-', '_' and '.'. Required.
	Name string `json:"name"`
	// URL is where the payload is POSTed: https, or http on loopback
	// only unless AllowHTTP. Required.
	URL string `json:"url"`
	// SecretFiles are files each holding one signing secret
	// ("whsec_" + base64, as Standard Webhooks gives them, or raw bytes).
	// Every secret signs every request (webhook-signature carries one
	// "v1,…" per secret), so a receiver can rotate: add the new secret,
	// switch the receiver, remove the old one. Empty: unsigned.
	SecretFiles []string `json:"secret_files"`
	// KeyRetention is how long the receiver keeps an idempotency key
	// (Stripe: at least 24 h; Adyen: 31 days). Retries stop once this
	// much time has passed since the first attempt: the row is
	// dead-lettered "outcome unknown: reconcile", never retried under a
	// new key. Default 24h.
	KeyRetention Duration `json:"key_retention"`
	// KeyMaxLen is the longest key the receiver accepts. The dispatcher
	// refuses to start when its keys ([KeyLen] bytes) are longer: a key is
	// never truncated. Default 255.
	KeyMaxLen int `json:"key_max_len"`
	// KeyCharset lists the characters the receiver accepts in a key;
	// empty: any printable ASCII. The dispatcher refuses to start when its
	// keys use another.
	KeyCharset string `json:"key_charset"`
	// Concurrency is the most requests in flight to the endpoint at once.
	// Default 4.
	Concurrency int `json:"concurrency"`
	// Timeout bounds one request, from connecting to the last byte of the
	// answer read. Default 10s.
	Timeout Duration `json:"timeout"`
	// CAFile, if set, is a PEM file of the CAs that may sign the
	// receiver's certificate, instead of the system's. TLS is always
	// verified.
	CAFile string `json:"ca_file"`
	// AllowHTTP allows a plain-http URL to a host other than loopback.
	AllowHTTP bool `json:"allow_http"`
	// ContentType is the request's Content-Type. Default
	// "application/json".
	ContentType string `json:"content_type"`

	secrets [][]byte
	tls     *tls.Config
}

// Duration is a time.Duration that reads from JSON as "30s" or "24h".
type Duration time.Duration

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// ValidateName reports, wrapping [ErrConfig], why name is not an endpoint
// name.
func ValidateName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("%w: endpoint name %q: want 1 to 64 bytes", ErrConfig, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%w: endpoint name %q: only letters, digits, '-', '_' and '.'", ErrConfig, name)
		}
	}
	return nil
}

// CheckKeyShape reports, wrapping [ErrConfig], whether keys of length n
// made of chars fit an endpoint that accepts keys of at most maxLen bytes
// of charset (empty: printable ASCII).
func CheckKeyShape(name string, maxLen int, charset string, n int, chars string) error {
	if n > maxLen {
		return fmt.Errorf("%w: endpoint %s: keys are %d bytes, the receiver takes at most %d (key_max_len); a key is never truncated", ErrConfig, name, n, maxLen)
	}
	if charset == "" {
		return nil
	}
	for i := 0; i < len(chars); i++ {
		if strings.IndexByte(charset, chars[i]) < 0 {
			return fmt.Errorf("%w: endpoint %s: keys use %q, which key_charset does not allow", ErrConfig, name, chars[i])
		}
	}
	return nil
}

// withDefaults fills in the defaults, checks the endpoint and loads its
// secrets and CAs.
func (e Endpoint) withDefaults() (Endpoint, error) {
	if err := ValidateName(e.Name); err != nil {
		return e, err
	}
	if e.KeyRetention == 0 {
		e.KeyRetention = Duration(24 * time.Hour)
	}
	if e.KeyMaxLen == 0 {
		e.KeyMaxLen = 255
	}
	if e.Concurrency == 0 {
		e.Concurrency = 4
	}
	if e.Timeout == 0 {
		e.Timeout = Duration(10 * time.Second)
	}
	if e.ContentType == "" {
		e.ContentType = "application/json"
	}
	switch {
	case e.KeyRetention < 0:
		return e, fmt.Errorf("%w: endpoint %s: key_retention negative", ErrConfig, e.Name)
	case e.Concurrency < 1 || e.Concurrency > 1024:
		return e, fmt.Errorf("%w: endpoint %s: concurrency %d: want 1 to 1024", ErrConfig, e.Name, e.Concurrency)
	case e.Timeout < 0:
		return e, fmt.Errorf("%w: endpoint %s: timeout negative", ErrConfig, e.Name)
	}
	if err := CheckKeyShape(e.Name, e.KeyMaxLen, e.KeyCharset, KeyLen, KeyChars); err != nil {
		return e, err
	}
	u, err := url.Parse(e.URL)
	if err != nil || u.Host == "" || u.User != nil || u.Fragment != "" {
		return e, fmt.Errorf("%w: endpoint %s: url %q: want https://host/path without credentials", ErrConfig, e.Name, e.URL)
	}
	switch u.Scheme {
	case "https":
	case "http":
		h := u.Hostname()
		if !e.AllowHTTP && h != "localhost" && !strings.HasPrefix(h, "127.") && h != "::1" {
			return e, fmt.Errorf("%w: endpoint %s: plain http to %s: use https, or set allow_http", ErrConfig, e.Name, h)
		}
	default:
		return e, fmt.Errorf("%w: endpoint %s: url scheme %q: want https or http", ErrConfig, e.Name, u.Scheme)
	}
	e.secrets = nil
	for _, f := range e.SecretFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return e, fmt.Errorf("%w: endpoint %s: secret: %w", ErrConfig, e.Name, err)
		}
		s, err := ParseSecret(string(bytes.TrimSpace(b)))
		if err != nil {
			return e, fmt.Errorf("%w: endpoint %s: secret %s: %w", ErrConfig, e.Name, f, err)
		}
		e.secrets = append(e.secrets, s)
	}
	e.tls = &tls.Config{MinVersion: tls.VersionTLS12}
	if e.CAFile != "" {
		pem, err := os.ReadFile(e.CAFile)
		if err != nil {
			return e, fmt.Errorf("%w: endpoint %s: ca_file: %w", ErrConfig, e.Name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return e, fmt.Errorf("%w: endpoint %s: ca_file %s: no PEM certificate", ErrConfig, e.Name, e.CAFile)
		}
		e.tls.RootCAs = pool
	}
	return e, nil
}

// ParseSecret returns the key of a Standard Webhooks secret: "whsec_" and
// base64, or (without the prefix) the bytes as they are. At least 16 bytes.
func ParseSecret(s string) ([]byte, error) {
	var key []byte
	if rest, ok := strings.CutPrefix(s, "whsec_"); ok {
		b, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return nil, fmt.Errorf("whsec_ secret: %w", err)
		}
		key = b
	} else {
		key = []byte(s)
	}
	if len(key) < 16 {
		return nil, fmt.Errorf("secret of %d bytes: want at least 16", len(key))
	}
	return key, nil
}

// LoadEndpoints reads an endpoints file: a JSON array of [Endpoint]s.
// Every endpoint is checked (names unique, URL, key shape, secrets
// readable); an error wraps [ErrConfig].
func LoadEndpoints(path string) ([]Endpoint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var eps []Endpoint
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eps); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, path, err)
	}
	return CheckEndpoints(eps)
}

// CheckEndpoints fills in the defaults of eps and checks them, as
// [LoadEndpoints] does.
func CheckEndpoints(eps []Endpoint) ([]Endpoint, error) {
	if len(eps) == 0 {
		return nil, fmt.Errorf("%w: no endpoints", ErrConfig)
	}
	out := make([]Endpoint, 0, len(eps))
	seen := map[string]bool{}
	for _, e := range eps {
		e, err := e.withDefaults()
		if err != nil {
			return nil, err
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("%w: endpoint %s twice", ErrConfig, e.Name)
		}
		seen[e.Name] = true
		out = append(out, e)
	}
	return out, nil
}

// Routes maps a subject to the endpoints a consumer delivers its messages
// to: a JSON object {"orders.created": ["billing", "crm"]}. A key ending
// in ".>" matches every subject under it; "*" matches one token.
type Routes map[string][]string

// LoadRoutes reads a routes file and checks every endpoint name in it.
func LoadRoutes(path string) (Routes, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var r Routes
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, path, err)
	}
	if len(r) == 0 {
		return nil, fmt.Errorf("%w: %s: no routes", ErrConfig, path)
	}
	for subj, names := range r {
		if subj == "" || strings.ContainsAny(subj, " \t") {
			return nil, fmt.Errorf("%w: route %q: want a subject", ErrConfig, subj)
		}
		for _, n := range names {
			if err := ValidateName(n); err != nil {
				return nil, fmt.Errorf("route %s: %w", subj, err)
			}
		}
	}
	return r, nil
}

// Match returns the endpoints subject is routed to, sorted, each once.
func (r Routes) Match(subject string) []string {
	var out []string
	for pat, names := range r {
		if subjectMatch(pat, subject) {
			out = append(out, names...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Endpoints returns every endpoint name the routes use, sorted, each once.
func (r Routes) Endpoints() []string {
	var out []string
	for _, names := range r {
		out = append(out, names...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func subjectMatch(pat, subj string) bool {
	p := strings.Split(pat, ".")
	s := strings.Split(subj, ".")
	for i, t := range p {
		if t == ">" {
			return len(s) > i
		}
		if i >= len(s) || (t != "*" && t != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}
