package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
)

// Fingerprint is what a request's key is bound to: a hash for each part
// (the method, the route, the body, and each request header the route
// names), so that a mismatch can say which part differs.
type Fingerprint map[string]string

// RequestFingerprint returns the fingerprint of a request: method, route, body
// and the headers named (their values as sent, joined; an absent header
// counts as empty).
func RequestFingerprint(method, route string, h http.Header, headers []string, body []byte) Fingerprint {
	fp := Fingerprint{"method": digest([]byte(method)), "route": digest([]byte(route)), "body": digest(body)}
	for _, name := range headers {
		name = http.CanonicalHeaderKey(name)
		fp["header "+name] = digest([]byte(strings.Join(h.Values(name), "\x00")))
	}
	return fp
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:16])
}

// String is the stored form: "part=hash" pairs sorted by part, one per
// line.
func (f Fingerprint) String() string {
	parts := make([]string, 0, len(f))
	for k, v := range f {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, "\n")
}

// ParseFingerprint reads the stored form back.
func ParseFingerprint(s string) Fingerprint {
	f := Fingerprint{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			f[k] = v
		}
	}
	return f
}

// Diff names the parts whose hashes differ between f and g (a part only
// one has counts), sorted; none means the fingerprints are equal.
func (f Fingerprint) Diff(g Fingerprint) []string {
	var d []string
	for k, v := range f {
		if g[k] != v {
			d = append(d, k)
		}
	}
	for k := range g {
		if _, ok := f[k]; !ok {
			d = append(d, k)
		}
	}
	slices.Sort(d)
	return d
}
