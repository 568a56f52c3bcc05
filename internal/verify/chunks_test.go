package verify_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/pipelinetest"
	"github.com/jetinbox/jetinbox/internal/verify"
)

// TestVerifyChunksGiveTheSameReport: 10,000 messages, copies of some IDs
// published again after the duplicate window (in other chunks than their
// first), a poison message and its copy, and one violation of each kind
// planted: Run gives the same report whether it judges the stream in one
// chunk or in chunks of 97 or 1000 messages, over the whole stream and over
// a range, and the counts are the planted ones.
func TestVerifyChunksGiveTheSameReport(t *testing.T) {
	t.Parallel()
	const n = 10000
	ctx := context.Background()
	const window = time.Second
	e := pipelinetest.New(t, jsinbox.StreamConfig{DuplicateWindow: window}, 16)
	js, pool := e.JS, e.Pool
	pub, _ := jsinbox.NewPublisher(js, jsinbox.PublisherConfig{})
	defer pub.Close()
	publish := func(ins ...inbox.Intent) {
		t.Helper()
		for _, in := range ins {
			if err := pub.PublishAsync(ctx, in); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	load := pipeline.Generate(pipeline.Load{Count: n, Accounts: 16, Prefix: "c"})
	poison := inbox.Intent{ID: "bad-1", Subject: "intents.poison", Payload: []byte(`{"account":1,`)}
	publish(append(load, poison)...) // poison is seq n+1
	time.Sleep(window + 200*time.Millisecond)
	// Copies after the window: they land in other chunks than the first.
	publish(load[4], load[4115], load[n-1], poison)
	consumeSettled(t, js, pool)

	opts := verify.Options{Scope: "ledger", Durable: "ledger", Ledger: true}
	check := func(what string, o verify.Options, want func(r *verify.Report) bool) {
		t.Helper()
		var first *verify.Report
		for _, chunk := range []int{1 << 30, 97, 1000} {
			r, err := verify.Run(ctx, js, pool, verify.WithChunk(o, chunk))
			if err != nil {
				t.Fatal(err)
			}
			if !want(r) {
				var b strings.Builder
				r.WriteTable(&b)
				t.Fatalf("%s, chunks of %d:\n%s", what, chunk, b.String())
			}
			if first == nil {
				first = r
				continue
			}
			if !reflect.DeepEqual(first, r) {
				t.Errorf("%s: chunks of %d give\n%+v\none chunk gives\n%+v", what, chunk, *r, *first)
			}
		}
	}
	check("settled", opts, func(r *verify.Report) bool {
		return r.Clean() && r.StreamMessages == n+5 && r.DistinctIDs == n+1 && r.AppliedOnce == n && r.Rejected == 1 && r.DeadLettered == 1
	})

	for _, q := range []string{
		`INSERT INTO ledger_entries (message_id, account, amount) SELECT message_id, account, amount FROM ledger_entries WHERE message_id = 'c-4115'`,
		`DELETE FROM inbox WHERE message_id = 'c-6667'`,
		`DELETE FROM ledger_entries WHERE message_id = 'c-7'`,
		`INSERT INTO ledger_entries (message_id, account, amount) VALUES ('ghost', 1, 5)`,
		`INSERT INTO inbox (scope, message_id, fingerprint, status) SELECT 'ledger', 'ghost-row', fingerprint, 'applied' FROM inbox WHERE message_id = 'c-8'`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	check("planted", opts, func(r *verify.Report) bool {
		return r.StreamMessages == n+5 && r.Duplicated == 1 && r.Lost == 1 && r.RowWithoutEffect == 2 &&
			r.Unexpected == 2 && r.EffectWithoutRow == 2 && r.AppliedOnce == n-3 && r.BalanceMismatches > 0
	})
	ranged := opts
	ranged.Range = verify.Range{FromSeq: 3334, ToSeq: uint64(n + 3)}
	check("range", ranged, func(r *verify.Report) bool {
		return r.Partial && r.StreamMessages == n-3334+4 && r.Duplicated == 1 && r.Lost == 1 && r.EffectWithoutRow == 1 && r.Unexpected == 0
	})
}
