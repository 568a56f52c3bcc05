package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// FreeLoopbackPorts returns n distinct TCP ports on 127.0.0.1 that are free
// now (all listeners open at once, then closed), for servers started on a
// port of their own, and kept across restarts, by the tests.
//
// They are taken below the kernel's ephemeral range where it leaves room.
// A port from that range (what "127.0.0.1:0" gives) can be taken by the
// local end of any outgoing connection on the machine, between its close
// here and the server's bind, or while a node is down between a kill and
// its restart; the server then never listens. make stress saw exactly that
// once: "node n1 not ready after 3m0s" for an in-process cluster node
// whose client port had been picked this way. Below the range only
// another explicit pick can collide, and picks are random over thousands
// of ports.
func FreeLoopbackPorts(n int) ([]int, error) {
	lo, hi := belowEphemeral()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		var l net.Listener
		var err error
		for tries := 0; hi > lo && tries < 200; tries++ {
			if l, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo))); err == nil {
				break
			}
		}
		if l == nil {
			if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				return nil, fmt.Errorf("testenv: free port: %w", err)
			}
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// belowEphemeral is the range of ports FreeLoopbackPorts picks from:
// 10000 up to the start of the kernel's ephemeral range, or none where
// that range is unknown or starts too low to leave room.
func belowEphemeral() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	var first, last int
	if _, err := fmt.Sscan(string(b), &first, &last); err != nil || first < 12000 {
		return 0, 0
	}
	return 10000, first
}

// freePort is one of [FreeLoopbackPorts].
func freePort() (int, error) {
	ps, err := FreeLoopbackPorts(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}
