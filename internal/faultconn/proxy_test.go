package faultconn

import (
	"bufio"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestProxyCutAndMend: the proxy forwards, a cut resets the connections
// through it and refuses new ones, a mend lets them in again on the same
// address, and nothing is left running after Close.
func TestProxyCutAndMend(t *testing.T) {
	defer goleak.VerifyNone(t)
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	p, err := NewProxy("127.0.0.1:0", echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	roundTrip := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		_, err := bufio.NewReader(c).ReadString('\n')
		return err
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	addr := p.Addr()
	p.Cut()
	if err := roundTrip(c); err == nil {
		t.Error("a connection survived the cut")
	}
	if c2, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c2.Close()
		t.Error("the cut proxy accepted a connection")
	}
	if err := p.Mend(); err != nil {
		t.Fatal(err)
	}
	if p.Addr() != addr {
		t.Errorf("address changed across cut and mend: %s → %s", addr, p.Addr())
	}
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := roundTrip(c3); err != nil {
		t.Fatalf("after the mend: %v", err)
	}
	c3.Close()
	p.Close()
	echo.Close()
}
