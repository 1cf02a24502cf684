package faults

import (
	"net"
	"testing"
	"time"
)

// A dial whose source port is its destination port connects with nothing
// listening; StartServer must not take that for the server.
func TestSelfConnectIsNotAServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.TCPAddr)
	l.Close()
	d := net.Dialer{LocalAddr: addr, Timeout: time.Second}
	c, err := d.Dial("tcp", addr.String())
	if err != nil {
		t.Fatalf("a dial from %v to itself: %v", addr, err)
	}
	defer c.Close()
	if !selfConnected(c) {
		t.Fatalf("a dial from %v to itself is not seen as self-connected", addr)
	}
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	c2, err := net.Dial("tcp", other.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if selfConnected(c2) {
		t.Fatal("a dial to a listener is seen as self-connected")
	}
}
