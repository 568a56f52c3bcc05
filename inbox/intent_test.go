package inbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jetinbox/jetinbox/inbox"
)

// TestIntentValidate: the one validator the publisher, the outbox and the
// relay share refuses what no inbox could store or no relay could publish,
// and takes the rest.
func TestIntentValidate(t *testing.T) {
	bad := []inbox.Intent{
		{Subject: "intents.a"},
		{ID: "x"},
		{ID: "has space", Subject: "intents.a"},
		{ID: "x", Subject: "intents." + strings.Repeat("s", inbox.MaxSubjectLen)},
		{ID: "x", Subject: "intents.*"},
		{ID: "x", Subject: "intents.>"},
		{ID: "x", Subject: "intents..a"},
		{ID: "x", Subject: "intents.a."},
		{ID: "x", Subject: "intents.a b"},
		{ID: "x", Subject: "intents.\x00"},
		{ID: "x", Subject: "intents.\xff"},
		{ID: "x", Subject: "intents.a", Parent: "bad parent"},
	}
	for _, in := range bad {
		if err := in.Validate(); !errors.Is(err, inbox.ErrBadIntent) {
			t.Errorf("Validate(%+v) = %v, want ErrBadIntent", in, err)
		}
	}
	good := []inbox.Intent{
		{ID: "x", Subject: "intents.a"},
		{ID: "ship-1", Subject: "intents.shipping.eu", Payload: []byte("{}"), Parent: "order-1"},
		{ID: "x", Subject: "intents." + strings.Repeat("s", inbox.MaxSubjectLen-len("intents."))},
	}
	for _, in := range good {
		if err := in.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", in, err)
		}
	}
}
