package delivery_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/jetinbox/jetinbox/delivery"
)

// The spec's published vector: secret, message ID, timestamp and payload
// give exactly this signature.
func TestSignPublishedVector(t *testing.T) {
	key, err := delivery.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	got := delivery.Sign([][]byte{key}, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("signature %s, want %s", got, want)
	}
}

// Several secrets sign at once (rotation): the spec's own library
// verifies the header under each of them, and under no other.
func TestSignRotationVerifiesWithTheSpecLibrary(t *testing.T) {
	old, _ := delivery.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	cur, _ := delivery.ParseSecret("whsec_" + "c2VjcmV0LWtleS1udW1iZXItdHdvLTMyYnl0ZXM=")
	now := time.Now()
	payload := []byte(`{"n":1}`)
	key := delivery.Key("scope", "m-1", "billing")
	h := http.Header{}
	h.Set(delivery.HeaderID, key)
	h.Set(delivery.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(delivery.HeaderSignature, delivery.Sign([][]byte{old, cur}, key, now, payload))
	if n := strings.Count(h.Get(delivery.HeaderSignature), "v1,"); n != 2 {
		t.Fatalf("%d signatures, want 2", n)
	}
	for _, s := range []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_c2VjcmV0LWtleS1udW1iZXItdHdvLTMyYnl0ZXM="} {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := wh.Verify(payload, h); err != nil {
			t.Errorf("secret %s: %v", s, err)
		}
	}
	other, _ := standardwebhooks.NewWebhook("whsec_b3RoZXItc2VjcmV0LW90aGVyLXNlY3JldA==")
	if err := other.Verify(payload, h); err == nil {
		t.Error("a third secret verified the header")
	}
}

// The key is stable and of one shape; the shape is checked against each
// endpoint at start, never truncated.
func TestKeyShape(t *testing.T) {
	a, b := delivery.Key("s", "m", "e"), delivery.Key("s", "m", "e")
	if a != b || len(a) != delivery.KeyLen || !strings.HasPrefix(a, delivery.KeyPrefix) {
		t.Fatalf("key %q, %q", a, b)
	}
	if delivery.Key("s", "m", "e2") == a || delivery.Key("sm", "", "e") == delivery.Key("s", "m", "e") {
		t.Error("keys of different calls meet")
	}
	for _, c := range a {
		if !strings.ContainsRune(delivery.KeyChars, c) {
			t.Errorf("key %q has %q, outside KeyChars", a, c)
		}
	}
	base := delivery.Endpoint{Name: "w", URL: "https://example.invalid/hook"}
	short := base
	short.KeyMaxLen = 32 // shorter than the key: refused, not truncated
	digits := base
	digits.KeyCharset = "0123456789abcdef"
	ok := base
	ok.KeyMaxLen = 40 // Worldline's limit
	for _, tc := range []struct {
		ep   delivery.Endpoint
		fail bool
	}{{short, true}, {digits, true}, {ok, false}} {
		_, err := delivery.CheckEndpoints([]delivery.Endpoint{tc.ep})
		if (err != nil) != tc.fail {
			t.Errorf("key_max_len %d, key_charset %q: err %v", tc.ep.KeyMaxLen, tc.ep.KeyCharset, err)
		}
	}
	if _, err := delivery.CheckEndpoints([]delivery.Endpoint{{Name: "x", URL: "http://10.0.0.1/hook"}}); err == nil {
		t.Error("plain http to another host accepted without allow_http")
	}
}

func ExampleKey() {
	// The same call has the same key on every attempt, in every dispatcher.
	k := delivery.Key("billing-effect", "order-42", "payments")
	fmt.Println(len(k), k == delivery.Key("billing-effect", "order-42", "payments"))
	// Output: 36 true
}
