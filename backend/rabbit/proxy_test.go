package rabbit

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// proxy is a loopback TCP proxy to the broker whose connections a test can
// cut, as a network failure would, while new connections keep working.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns []net.Conn
	cuts  int
	wg    sync.WaitGroup
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// url rewrites an AMQP URL to go through the proxy.
func (p *proxy) url(t testing.TB, amqpURL string) string {
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// cut closes every connection through the proxy.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.cuts++
}

func (p *proxy) close() {
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}
