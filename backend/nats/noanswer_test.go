package nats

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestPullWithoutAnswer: a long-poll pull request the server never answers
// (held back by a proxy, as a loaded 2.9.10 now and then left one
// unanswered past PollWait + 5 s: Delivery/WakesOnEnqueue, "no answer from
// the server") does not fail the Receive: it pulls again and hands out the
// message enqueued meanwhile. The unanswered request, when it reaches the
// server after all, keeps its inbox for a while: a message the server gives
// it is handed back uncounted, not lost to nobody, and handed out once.
func TestPullWithoutAnswer(t *testing.T) {
	t.Parallel()
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		u := realURL(t)
		testPullWithoutAnswer(t, strings.TrimPrefix(u, "nats://"))
	})
	t.Run("inproc", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, t.TempDir(), 0)
		testPullWithoutAnswer(t, s.Addr().String())
	})
}

func testPullWithoutAnswer(t *testing.T, target string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := startPullProxy(t, target)
	q := queueName(t)
	cfg := testConfig("nats://" + p.addr())
	cfg.PollWait = 5 * time.Second // the late request waits that long on the server
	b, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.DeleteQueue(context.Background(), q)
		_ = b.Close()
	})
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	p.holdNext(workConsumer(q), 1)

	lease := 30 * time.Second // outlasts the test: a lapse would hide a loss
	type result struct {
		ds  []*driver.Delivery
		err error
	}
	res := make(chan result, 1)
	go func() {
		ds, err := b.Receive(ctx, q, 10, lease)
		res <- result{ds, err}
	}()
	for p.heldCount() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the Receive never long-polled")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: q + "-a", Body: []byte("a")}}); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || len(r.ds) != 1 {
		t.Fatalf("a Receive whose long poll got no answer, with a message enqueued meanwhile: %d deliveries, %v; want the message", len(r.ds), r.err)
	}
	if d := r.ds[0]; string(d.Body) != "a" || d.Deliveries != 1 {
		t.Fatalf("got %q with Deliveries %d, want %q and 1", d.Body, d.Deliveries, "a")
	}
	if err := b.Ack(ctx, r.ds[0]); err != nil {
		t.Fatal(err)
	}

	// The unanswered request reaches the server late: it takes the next
	// message, which its drain hands back as a copy.
	c, err := b.work.Consumer(ctx, workConsumer(q))
	if err != nil {
		t.Fatal(err)
	}
	p.release()
	released := time.Now()
	waitFor(ctx, t, 3*time.Second, "the late request waiting on the server (its inbox must be kept)", func() bool {
		info, err := c.Info(ctx)
		return err == nil && info.NumWaiting > 0
	})
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: q + "-b", Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	inTime := time.Since(released) < cfg.PollWait/2 // the late request still waited
	ds, err := b.Receive(ctx, q, 10, lease)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive after the late request: %d deliveries, %v", len(ds), err)
	}
	rc := ds[0].Handle.(*receipt)
	if string(ds[0].Body) != "b" || ds[0].Deliveries != 1 {
		t.Fatalf("got %q with Deliveries %d, want %q and 1", ds[0].Body, ds[0].Deliveries, "b")
	}
	if !strings.Contains(rc.msgID, "~") {
		if inTime {
			t.Errorf("b (Nats-Msg-Id %q) was not handed back: the late request, still waiting, did not take it", rc.msgID)
		} else {
			t.Logf("b (Nats-Msg-Id %q) was not handed back: enqueued too late for the late request", rc.msgID)
		}
	}
	if err := b.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}

	// Nothing is left or handed out twice.
	rctx, rcancel := context.WithTimeout(ctx, time.Second)
	ds, err = b.Receive(rctx, q, 10, lease)
	rcancel()
	if len(ds) != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a last Receive: %d deliveries (%v), want none", len(ds), err)
	}
	waitFor(ctx, t, 10*time.Second, "an empty queue", func() bool {
		st, err := b.Stats(ctx, q)
		return err == nil && st.Ready == 0 && st.InFlight == 0
	})
	if info, err := c.Info(ctx); err != nil || info.NumAckPending != 0 || info.NumRedelivered != 0 {
		t.Fatalf("consumer after the test: %+v, %v: want nothing pending or redelivered", info, err)
	}
}

// waitFor waits up to d for ok.
func waitFor(ctx context.Context, t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for !ok() {
		if ctx.Err() != nil {
			t.Fatalf("waited %v for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pullProxy forwards NATS connections to a server, holding back the long-poll
// pull requests of a consumer that the test asks it to (they reach the
// server only at release, after whatever the client sent since), as a
// server that does not answer them in time looks to the client.
type pullProxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	consumer string // hold long polls to this consumer
	hold     int    // how many more to hold
	held     []heldReq
	conns    []net.Conn
}

type heldReq struct {
	w   *lockedWriter
	raw []byte
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func startPullProxy(t *testing.T, target string) *pullProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pullProxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

func (p *pullProxy) addr() string { return p.ln.Addr().String() }

func (p *pullProxy) holdNext(consumer string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.consumer, p.hold = consumer, n
}

func (p *pullProxy) heldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// release sends the held requests on to the server.
func (p *pullProxy) release() {
	p.mu.Lock()
	held := p.held
	p.held = nil
	p.mu.Unlock()
	for _, h := range held {
		_, _ = h.w.Write(h.raw)
	}
}

func (p *pullProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() {
			_, _ = io.Copy(c, s)
			c.Close()
		}()
		go func() {
			p.forward(&lockedWriter{w: s}, c)
			s.Close()
		}()
	}
}

// forward copies the client's protocol to the server message by message,
// holding back the pull requests asked for.
func (p *pullProxy) forward(w *lockedWriter, c net.Conn) {
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		raw := line
		f := strings.Fields(string(line))
		if len(f) >= 3 && (f[0] == "PUB" || f[0] == "HPUB") {
			n, err := strconv.Atoi(f[len(f)-1])
			if err != nil {
				return
			}
			body := make([]byte, n+2)
			if _, err := io.ReadFull(r, body); err != nil {
				return
			}
			raw = append(raw, body...)
			if p.holds(f[1], body, w, raw) {
				continue
			}
		}
		if _, err := w.Write(raw); err != nil {
			return
		}
	}
}

// holds reports whether the message to subject is a long poll to hold, and
// keeps it (raw, for w) then.
func (p *pullProxy) holds(subject string, body []byte, w *lockedWriter, raw []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold == 0 || !strings.HasPrefix(subject, "$JS.API.CONSUMER.MSG.NEXT.") ||
		!strings.HasSuffix(subject, "."+p.consumer) || !bytes.Contains(body, []byte(`"expires"`)) {
		return false
	}
	p.hold--
	p.held = append(p.held, heldReq{w: w, raw: raw})
	return true
}
