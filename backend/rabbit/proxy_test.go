package rabbit

import (
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// proxy is a loopback TCP proxy to the broker whose connections a test can
// cut, as a network failure would, while new connections keep working. It
// can also play a broker alarm: send connection.blocked to the client and
// stop reading from it, as RabbitMQ does.
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	pairs  []*pair
	cuts   int
	paused bool
	resume chan struct{} // closed when a pause ends
	wg     sync.WaitGroup

	// dropConfirms swallows the broker's basic.ack frames (publisher
	// confirms) on their way to the clients; dropAcks swallows the
	// clients' basic.ack frames (consumer acks) on their way to the
	// broker. dropped counts the frames swallowed.
	dropConfirms, dropAcks atomic.Bool
	dropped                atomic.Int64
}

// pair is one proxied connection.
type pair struct {
	client, server net.Conn
	wmu            sync.Mutex // serialises frames written to the client
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	p, err := newProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	return p
}

// newProxy starts a proxy that the caller closes.
func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, resume: make(chan struct{})}
	close(p.resume)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// url rewrites an AMQP URL to go through the proxy.
func (p *proxy) url(t testing.TB, amqpURL string) string {
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	return p.rewrite(u)
}

func (p *proxy) rewrite(u *url.URL) string {
	v := *u
	v.Host = p.ln.Addr().String()
	return v.String()
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
		pr := &pair{client: c, server: s}
		p.mu.Lock()
		p.pairs = append(p.pairs, pr)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.upstream(pr)
		go p.downstream(pr)
	}
}

// upstream copies client to server frame by frame (after the 8-byte
// protocol header), holding back while paused.
func (p *proxy) upstream(pr *pair) {
	defer p.wg.Done()
	defer pr.client.Close()
	defer pr.server.Close()
	protocol := make([]byte, 8)
	if _, err := io.ReadFull(pr.client, protocol); err != nil {
		return
	}
	if _, err := pr.server.Write(protocol); err != nil {
		return
	}
	hdr := make([]byte, 7)
	for {
		if _, err := io.ReadFull(pr.client, hdr); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(hdr[3:7])
		frame := make([]byte, 7+int(size)+1)
		copy(frame, hdr)
		if _, err := io.ReadFull(pr.client, frame[7:]); err != nil {
			return
		}
		p.mu.Lock()
		resume := p.resume
		p.mu.Unlock()
		<-resume
		if p.dropAcks.Load() && isBasicAck(frame) {
			p.dropped.Add(1)
			continue
		}
		if _, err := pr.server.Write(frame); err != nil {
			return
		}
	}
}

// isBasicAck reports whether frame is a basic.ack method frame: a
// consumer's ack going up, a publisher confirm coming down.
func isBasicAck(frame []byte) bool {
	return len(frame) >= 11 && frame[0] == 1 &&
		binary.BigEndian.Uint16(frame[7:9]) == 60 && binary.BigEndian.Uint16(frame[9:11]) == 80
}

// downstream copies server to client frame by frame (after the 8-byte
// protocol header has gone up), so that frames can be injected between them.
func (p *proxy) downstream(pr *pair) {
	defer p.wg.Done()
	defer pr.client.Close()
	defer pr.server.Close()
	hdr := make([]byte, 7)
	for {
		if _, err := io.ReadFull(pr.server, hdr); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(hdr[3:7])
		frame := make([]byte, 7+int(size)+1)
		copy(frame, hdr)
		if _, err := io.ReadFull(pr.server, frame[7:]); err != nil {
			return
		}
		if p.dropConfirms.Load() && isBasicAck(frame) {
			p.dropped.Add(1)
			continue
		}
		pr.wmu.Lock()
		_, err := pr.client.Write(frame)
		pr.wmu.Unlock()
		if err != nil {
			return
		}
	}
}

// methodFrame encodes a connection-class method frame on channel 0.
func methodFrame(method uint16, args []byte) []byte {
	payload := binary.BigEndian.AppendUint16(nil, 10) // class connection
	payload = binary.BigEndian.AppendUint16(payload, method)
	payload = append(payload, args...)
	f := []byte{1, 0, 0}
	f = binary.BigEndian.AppendUint32(f, uint32(len(payload)))
	f = append(f, payload...)
	return append(f, 0xCE)
}

func (p *proxy) inject(frame []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.pairs {
		pr.wmu.Lock()
		pr.client.Write(frame)
		pr.wmu.Unlock()
	}
}

// block sends connection.blocked with reason to every client and stops
// forwarding what they send.
func (p *proxy) block(reason string) {
	p.pause()
	p.inject(methodFrame(60, append([]byte{byte(len(reason))}, reason...)))
}

// pause stops forwarding what clients send.
func (p *proxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		p.paused = true
		p.resume = make(chan struct{})
	}
}

// unblock sends connection.unblocked and forwards again.
func (p *proxy) unblock() {
	p.inject(methodFrame(61, nil))
	p.mu.Lock()
	if p.paused {
		p.paused = false
		close(p.resume)
	}
	p.mu.Unlock()
}

// cut closes every connection through the proxy.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.pairs {
		pr.client.Close()
		pr.server.Close()
	}
	p.pairs = nil
	p.cuts++
}

func (p *proxy) close() {
	p.ln.Close()
	p.unblock()
	p.cut()
	p.wg.Wait()
}
