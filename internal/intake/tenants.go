package intake

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
)

// Tenant is one client of the intake, as the tenants file lists it.
type Tenant struct {
	// Name is the principal its keys are scoped by.
	Name string `json:"name"`
	// TokenSHA256 is the hex SHA-256 of its bearer token: the file holds
	// no token.
	TokenSHA256 string `json:"token_sha256"`
	// Subjects is the subject prefix its intents must start with, such as
	// "intents.acme."; empty: the intake's -subject-prefix.
	Subjects string `json:"subjects,omitempty"`
	// Rate and Burst bound its requests per second; 0: the intake's
	// -rate and -burst.
	Rate  float64 `json:"rate,omitempty"`
	Burst int     `json:"burst,omitempty"`
}

// TenantsFile is the tenants file: {"tenants": [...]}.
type TenantsFile struct {
	Tenants []Tenant `json:"tenants"`
}

// HashToken returns the hex SHA-256 of a bearer token, as the tenants
// file stores it.
func HashToken(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

// LoadTenants reads and checks a tenants file.
func LoadTenants(path string) ([]Tenant, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f TenantsFile
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("tenants file %s: %w", path, err)
	}
	if len(f.Tenants) == 0 {
		return nil, fmt.Errorf("tenants file %s: no tenants", path)
	}
	names, hashes := map[string]bool{}, map[string]bool{}
	var errs []error
	for i, t := range f.Tenants {
		switch {
		case t.Name == "" || len(t.Name) > 64 || inbox.ValidateID(t.Name) != nil:
			errs = append(errs, fmt.Errorf("tenant %d: name %q: want 1 to 64 printable characters without spaces", i+1, t.Name))
		case names[t.Name]:
			errs = append(errs, fmt.Errorf("tenant %q listed twice", t.Name))
		}
		names[t.Name] = true
		if h, err := hex.DecodeString(t.TokenSHA256); err != nil || len(h) != sha256.Size {
			errs = append(errs, fmt.Errorf("tenant %q: token_sha256: want 64 hex digits (the SHA-256 of its token, e.g. `printf %%s TOKEN | sha256sum`)", t.Name))
		} else if hashes[strings.ToLower(t.TokenSHA256)] {
			errs = append(errs, fmt.Errorf("tenant %q: token_sha256 shared with another tenant", t.Name))
		}
		hashes[strings.ToLower(t.TokenSHA256)] = true
		if t.Rate < 0 || t.Burst < 0 {
			errs = append(errs, fmt.Errorf("tenant %q: negative rate or burst", t.Name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("tenants file %s: %w", path, err)
	}
	return f.Tenants, nil
}

// bucket is a token bucket: rate tokens a second, at most burst.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate float64, burst int) *bucket {
	return &bucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// take takes a token, or says how long until one is there.
func (b *bucket) take(now time.Time) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
}
