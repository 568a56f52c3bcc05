package chaos

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestChaosHTTPSmoke is the CI-sized `jetinbox chaos -http`: the same-key
// rows must come out lost 0 and duplicated 0 under dropped requests and
// answers, client timeouts, intake kills, relay and worker crashes and a
// NATS and a PostgreSQL restart; the unsafe rows must show what they lose,
// so the harness can see what it claims to check.
func TestChaosHTTPSmoke(t *testing.T) {
	t.Parallel()
	res, err := RunHTTP(context.Background(), HTTPOptions{Intents: 50, DropRequest: 0.15, DropResponse: 0.15, Timeout: 30 * time.Millisecond,
		Burst: 6, Conflicts: 10, Kills: 2, Restarts: true, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	WriteHTTP(&b, res)
	t.Logf("\n%s", b.String())
	if !res.Clean() {
		t.Fatal("the HTTP run is not clean")
	}
	for _, r := range res.Rows {
		if r.Lost+r.AppliedOnce+r.Duplicated != r.Intents {
			t.Errorf("%s: %d + %d + %d != %d intents", r.Client, r.Lost, r.AppliedOnce, r.Duplicated, r.Intents)
		}
	}
}
