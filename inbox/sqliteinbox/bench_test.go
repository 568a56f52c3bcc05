package sqliteinbox_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/sqliteinbox"
	"github.com/jetinbox/jetinbox/internal/effects"
)

// BenchmarkProcessLedger is the PostgreSQL store's benchmark of the same
// name on SQLite: batches of ledger intents, first deliveries, one
// transaction each, synchronous=FULL.
func BenchmarkProcessLedger(b *testing.B) {
	for _, size := range []int{1, 100, 1000, 6000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			_, db := newFile(b)
			ctx := context.Background()
			p, err := inbox.NewProcessor(sqliteinbox.New(db), effects.NewSQLiteLedger(), inbox.Config{Scope: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			msgs := make([]inbox.Message, size)
			seq := 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for i := range msgs {
					seq++
					msgs[i] = inbox.Message{ID: "m-" + strconv.Itoa(seq), Deliveries: 1,
						Payload: effects.Intent{Account: int64(1 + seq%1024), Amount: 5}.AppendJSON(nil), StreamSeq: uint64(seq)}
				}
				out, err := p.Process(ctx, msgs)
				if err != nil || out[0].Status != inbox.StatusApplied {
					b.Fatal(fmt.Sprint(err, out[0]))
				}
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
