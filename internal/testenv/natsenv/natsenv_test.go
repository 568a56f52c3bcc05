package natsenv

import (
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetinbox/jetinbox/internal/subproc"
	"github.com/jetinbox/jetinbox/internal/testenv"
)

func TestMain(m *testing.M) {
	// NATSProcs' tests start this binary again as nats-servers.
	subproc.Dispatch(map[string]func([]string) int{subproc.RoleNATSServer: subproc.NATSServer})
	testenv.MainNoLeaks(m)
}

func TestNATSRestartKeepsStream(t *testing.T) {
	n := NewNATS(t, NATSOptions{})
	url := n.URL()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := nc.JetStream()
	if _, err := js.AddStream(&nats.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: nats.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish("s.1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	if n.URL() != url {
		t.Fatalf("port changed across restart: %s != %s", n.URL(), url)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		si, err := js.StreamInfo("S")
		if err == nil {
			if si.State.Msgs != 1 {
				t.Fatalf("stream has %d messages after restart, want 1", si.State.Msgs)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStreamLimitsDoNotDependOnTheDisk: a stream may reserve more than the
// disk under the store has free. Left to itself the server caps what streams
// reserve at 75% of that free space, so the default limits of a few streams
// (16 GiB each) fail with "insufficient storage" on a small disk although
// these servers store little; a CI machine with a smaller disk than the
// developer's did just that.
func TestStreamLimitsDoNotDependOnTheDisk(t *testing.T) {
	n := NewNATS(t, NATSOptions{})
	var fs syscall.Statfs_t
	if err := syscall.Statfs(n.opts.StoreDir, &fs); err != nil {
		t.Fatal(err)
	}
	free := int64(fs.Bavail) * int64(fs.Bsize)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := nc.JetStream()
	if _, err := js.AddStream(&nats.StreamConfig{Name: "BIG", Subjects: []string{"big.>"}, Storage: nats.FileStorage, MaxBytes: free + 1<<30}); err != nil {
		t.Fatalf("a stream that may hold %d bytes, on a disk with %d free: %v", free+1<<30, free, err)
	}
}
