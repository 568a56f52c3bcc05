package bench

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"testing"
)

// TestRatiosPairRounds: ratios are taken round by round, so a fast round of
// one approach is never set against a slow round of the other.
func TestRatiosPairRounds(t *testing.T) {
	raw := []float64{100, 200, 100}
	jet := []float64{50, 100, 60}
	r := ratios(jet, raw)
	if r.med != 0.5 || r.lo != 0.5 || r.hi != 0.6 {
		t.Fatalf("ratios = %+v, want median 0.5 in 0.5–0.6", r)
	}
	// The old way, a median of each side's rates, would say 60/100 = 0.6.
	if got := median(jet) / median(raw); got == r.med {
		t.Fatalf("paired and unpaired medians agree (%v): the case does not tell them apart", got)
	}
	if s := r.String(); s != "0.50x (0.50–0.60)" {
		t.Fatalf("String() = %q", s)
	}
}

// TestBenchCommandSmoke runs the command small, on each store: every
// approach, paired ratios, both latency phases and the ledger check.
func TestBenchCommandSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own servers")
	}
	for _, store := range []string{"postgres", "sqlite"} {
		t.Run(store, func(t *testing.T) {
			var out bytes.Buffer
			err := Main(context.Background(), []string{"-store", store, "-n", "3000", "-naive-max", "200", "-rounds", "2",
				"-latency", "300ms", "-rate", "500", "-child=false", "-batch", "500"}, &out, io.Discard)
			if err != nil {
				t.Fatalf("bench: %v\n%s", err, out.String())
			}
			for _, want := range []string{
				`(?m)^store: ` + map[string]string{"postgres": "PostgreSQL", "sqlite": "SQLite"}[store],
				`(?m)^jetinbox consumer +\d+  \d+\.\d\dx \(\d+\.\d\d–\d+\.\d\d\)$`,
				`(?m)^jetinbox consumer, one hot account +\d+  \d+\.\d\dx \(\d+\.\d\d–\d+\.\d\d\)$`,
				`(?m)^publish-to-commit at 500 msg/s offered \(low load`,
				// The transaction's steps, from the processor's own marks.
				`(?m)^ +COMMIT \(the database's commit and flush\) +\d`,
				`(?m)^ +its transaction \(a batch of \d+\): BEGIN \d`,
				`(?m)^ +batch size as its messages saw it: p50 \d+`,
				`(?m)^ +Go runtime during the phase: \d+ GC cycles`,
				`(?m)^publish-to-commit at \d+ msg/s offered \(50% of the jetinbox maximum`,
				`(?m)^time to first commit of a cold consumer .*: median \d`,
				`(?m)^ledger verified`,
			} {
				if !regexp.MustCompile(want).MatchString(out.String()) {
					t.Errorf("output lacks %s:\n%s", want, out.String())
				}
			}
			// The outbox approach runs where the outbox lives: PostgreSQL.
			for _, want := range []string{
				`(?m)^jetinbox \+ a follow-up per credit +\d+  \d+\.\d\dx`,
				`(?m)^jetinbox \+ follow-ups / jetinbox: \d+\.\d\dx`,
				`(?m)^outbox relay draining 3000 rows into a stream: \d+ rows/s`,
				`(?m)^emit-to-publish at 500 msg/s offered \(relay beside the consumer`,
			} {
				if got := regexp.MustCompile(want).MatchString(out.String()); got != (store == "postgres") {
					t.Errorf("%s: output has %s: %v:\n%s", store, want, got, out.String())
				}
			}
		})
	}
	if err := Main(context.Background(), []string{"-store", "mysql"}, io.Discard, io.Discard); err == nil {
		t.Error("bench -store mysql was accepted")
	}
}

// BenchmarkHTTPIntake is `jetinbox bench -http`, small: the intake with
// keys against the same endpoint without the key store, on both stores.
func BenchmarkHTTPIntake(b *testing.B) {
	for range b.N {
		for _, s := range []string{"postgres", "sqlite"} {
			rows, err := BenchHTTP(context.Background(), s, 200, 8)
			if err != nil {
				b.Fatal(err)
			}
			var buf bytes.Buffer
			WriteHTTP(&buf, rows)
			b.Logf("\n%s", buf.String())
		}
	}
}
