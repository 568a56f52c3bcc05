package idempotency

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The Standard Webhooks headers a [Webhooks] route verifies.
const (
	WebhookIDHeader        = "webhook-id"
	WebhookTimestampHeader = "webhook-timestamp"
	WebhookSignatureHeader = "webhook-signature"
)

// ErrBadSignature wraps every refusal of a webhook's signature headers.
var ErrBadSignature = errors.New("idempotency: bad webhook signature")

// Webhooks makes a route a Standard Webhooks receiver: every request must
// carry webhook-id, webhook-timestamp (within Tolerance of now) and a
// webhook-signature ("v1,<base64 HMAC-SHA256 of id.timestamp.body>", one
// or more, space-separated) made with one of Secrets; else 401, nothing
// run. The webhook-id is the request's idempotency key: a repeat is
// answered from the store and never runs again, so a chain of jetinbox
// services (jetinbox deliver → this route) applies each call once end to
// end. An Idempotency-Key header, if sent too, must equal it.
type Webhooks struct {
	// Secrets are the signing keys; a signature made with any of them is
	// accepted, for rotation. Required.
	Secrets [][]byte
	// Tolerance is how far webhook-timestamp may be from now. Default 5
	// minutes, as the spec has it.
	Tolerance time.Duration
	// Now returns the current time. Default time.Now.
	Now func() time.Time
}

// Verify checks r's webhook headers against body and returns its
// webhook-id.
func (wh *Webhooks) Verify(h http.Header, body []byte) (string, error) {
	id, ts, sigs := h.Get(WebhookIDHeader), h.Get(WebhookTimestampHeader), h.Get(WebhookSignatureHeader)
	if id == "" || ts == "" || sigs == "" {
		return "", fmt.Errorf("%w: webhook-id, webhook-timestamp and webhook-signature are required", ErrBadSignature)
	}
	if err := ValidateKey(id); err != nil {
		return "", fmt.Errorf("%w: webhook-id: %w", ErrBadSignature, err)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: webhook-timestamp %q", ErrBadSignature, ts)
	}
	now := time.Now
	if wh.Now != nil {
		now = wh.Now
	}
	tol := wh.Tolerance
	if tol <= 0 {
		tol = 5 * time.Minute
	}
	if d := now().Sub(time.Unix(sec, 0)); d > tol || d < -tol {
		return "", fmt.Errorf("%w: webhook-timestamp %v from now, outside the %v tolerance", ErrBadSignature, d.Round(time.Second), tol)
	}
	if len(wh.Secrets) == 0 {
		return "", fmt.Errorf("%w: no secret configured", ErrBadSignature)
	}
	for _, key := range wh.Secrets {
		m := hmac.New(sha256.New, key)
		m.Write([]byte(id + "." + ts + "."))
		m.Write(body)
		want := m.Sum(nil)
		for _, s := range strings.Fields(sigs) {
			v, b64, ok := strings.Cut(s, ",")
			if !ok || v != "v1" {
				continue
			}
			got, err := base64.StdEncoding.DecodeString(b64)
			if err == nil && hmac.Equal(got, want) {
				return id, nil
			}
		}
	}
	return "", fmt.Errorf("%w: no signature matches", ErrBadSignature)
}
