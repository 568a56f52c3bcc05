package outbox_test

import (
	"fmt"

	"github.com/jetinbox/jetinbox/outbox"
)

// A relay's publish mode from a flag or setting: atomic batches by
// default, one row at a time for a stream that does not fsync each write,
// fast batches for a stream that allows them.
func ExampleParsePublishMode() {
	for _, s := range []string{"atomic", "each", "fast", "slow"} {
		m, err := outbox.ParsePublishMode(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		cfg := outbox.RelayConfig{Stream: "NOTIFICATIONS", Publish: m}
		fmt.Println(cfg.Publish)
	}
	// Output:
	// atomic
	// each
	// fast
	// outbox: publish mode "slow": want atomic, each or fast
}
