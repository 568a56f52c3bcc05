package console_test

import (
	"testing"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

// The shared PostgreSQL of the package's tests stops when they end; without
// this it outlived every run of the package's test binary.
func TestMain(m *testing.M) { testenv.Main(m) }
