package inbox_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/jetinbox/jetinbox/inbox"
)

// A batch timed step by step: how long BEGIN, the claim, the wait for the
// effect's turn, the effect and COMMIT took.
func ExampleWithStepTimes() {
	var (
		proc *inbox.Processor[pgx.Tx] // inbox.NewProcessor(pginbox.New(pool), handler, cfg)
		msgs []inbox.Message          // the batch
	)
	var st inbox.StepTimes
	if _, err := proc.Process(inbox.WithStepTimes(context.Background(), &st), msgs); err != nil {
		return
	}
	fmt.Println("claim", st.Claimed.Sub(st.Begun), "turn", st.Turn.Sub(st.Claimed),
		"effect", st.Applied.Sub(st.Turn), "commit", st.Committed.Sub(st.Applied))
}
