package deliverchaos

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

// The run starts this test binary again as its dispatcher processes.
func TestMain(m *testing.M) {
	subproc.Dispatch(map[string]func([]string) int{subproc.RoleJetinbox: Child})
	os.Exit(m.Run())
}

// The command's verdicts at small counts: the shipped row delivers each
// once (lost 0, applied twice 0) under every fault, dispatcher processes
// SIGKILLed after the receiver applied their request and before it
// answered among them, and both unsafe rows show the harm.
func TestChaosDeliverSmoke(t *testing.T) {
	if _, err := testenv.FindPostgresBin(); err != nil {
		t.Fatalf("PostgreSQL is required: %v", err)
	}
	o := Defaults()
	o.Deliveries = 30
	o.Progress = testWriter{t}
	o.Drop, o.Late, o.Fail500, o.Crash, o.Kill = 0.1, 0.1, 0.1, 0.03, 0.05
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	Print(&b, res)
	t.Log("\n" + b.String())
	for _, r := range res {
		if o.RestartPG && r.PGRestarts == 0 {
			t.Errorf("%s: PostgreSQL was not restarted", r.Name)
		}
		// The dice are seeded and drawn once per request, in the order the
		// requests come: with these settings each row's first kill is drawn
		// for one of its first 11 requests, and a row has at least 30.
		if r.Kills == 0 {
			t.Errorf("%s: no dispatcher process was killed", r.Name)
		}
	}
	if err := Check(res); err != nil {
		t.Fatal(err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}
