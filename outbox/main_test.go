package outbox_test

import (
	"testing"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

// The producer example takes a database from testenv's shared PostgreSQL,
// which Main stops when the tests end; without it the server outlived the
// test binary.
func TestMain(m *testing.M) { testenv.Main(m) }
