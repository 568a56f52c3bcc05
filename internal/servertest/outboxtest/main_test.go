package outboxtest

import (
	"testing"

	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
