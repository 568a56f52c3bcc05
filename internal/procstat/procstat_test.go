package procstat

import (
	"os"
	"testing"
	"time"
)

func TestReadSelf(t *testing.T) {
	deadline := time.Now().Add(time.Minute)
	for CPU(os.Getpid()) == 0 { // burn until a tick is counted
		if time.Now().After(deadline) {
			t.Fatal("no CPU counted for this process after a minute of work")
		}
		for i := 0; i < 1e6; i++ {
			_ = i * i
		}
	}
	st, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PPID != os.Getppid() {
		t.Fatalf("PPID %d, want %d", st.PPID, os.Getppid())
	}
	if _, err := Read(-1); err == nil {
		t.Fatal("Read(-1): no error")
	}
}
