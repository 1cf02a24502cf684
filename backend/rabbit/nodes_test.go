package rabbit

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

func TestSplitNodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"amqp://guest:guest@127.0.0.1:5672/", []string{"amqp://guest:guest@127.0.0.1:5672/"}},
		{"amqp://u:p@h1:5672,h2:5673,h3/vh?heartbeat=5", []string{
			"amqp://u:p@h1:5672/vh?heartbeat=5", "amqp://u:p@h2:5673/vh?heartbeat=5", "amqp://u:p@h3/vh?heartbeat=5"}},
		{"amqps://h1,h2", []string{"amqps://h1", "amqps://h2"}},
		{"amqp://u:p@[::1]:5672,[::1]:5673/", []string{"amqp://u:p@[::1]:5672/", "amqp://u:p@[::1]:5673/"}},
	} {
		got, err := splitNodes(c.in)
		if err != nil || strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("splitNodes(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"amqp://u:secret@h1,,h2/", "amqp://u:secret@h1,/", "h1:5672,h2:5672", "http://u:secret@h1,h2/"} {
		if _, err := splitNodes(bad); err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("splitNodes(%q): %v; want an error without the password", bad, err)
		}
	}
	if got := redact("amqp://u:secret@h1:5672,h2:5673/vh"); got != "amqp://u:xxx@h1:5672,h2:5673/vh" {
		t.Errorf("redact = %q", got)
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestOpenURLNodes: asyncplatform.Open takes a list of nodes and connects
// to the first one that answers.
func TestOpenURLNodes(t *testing.T) {
	t.Parallel()
	newBackend(t, Config{}) // skips when the broker is down
	ctx := testCtx(t)
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	raw := u.Scheme + "://" + u.User.String() + "@" + deadAddr(t) + "," + u.Host + u.Path + "?prefix=nodes"
	be, err := asyncplatform.Open(ctx, raw)
	if err != nil {
		t.Fatalf("Open of a URL whose first node is down: %v", err)
	}
	defer be.Close()
	b := be.(*Backend)
	b.mu.Lock()
	node, n := b.node, len(b.nodes)
	b.mu.Unlock()
	if n != 2 || node != 1 || b.cfg.Prefix != "nodes" {
		t.Fatalf("%d nodes, connected to node %d, prefix %q; want 2, 1 (the first is down), nodes", n, node, b.cfg.Prefix)
	}
}

// TestFailoverToOtherNode: when the node the backend is connected to dies
// (here a proxy, one of two in front of the broker, closed for good), the
// backend redials the other node at once, without waiting for the dead one
// to come back; enqueue and claim resume there.
func TestFailoverToOtherNode(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	pa, pb := startProxy(t, u.Host), startProxy(t, u.Host)
	v := *u
	v.Host = pa.ln.Addr().String() + "," + pb.ln.Addr().String()
	b := newBackend(t, Config{URL: v.String()})
	q := queueName(t, b)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "before", Body: []byte("1")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive before: %v %v", ds, err)
	}
	if err := b.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
	if b.node != 0 {
		t.Fatalf("connected to node %d first, want 0", b.node)
	}

	pa.close() // node 0 dies and stays dead
	killed := time.Now()
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := b.Enqueue(cctx, q, []driver.Message{{ID: "after", Body: []byte("2")}})
		cancel()
		if err == nil {
			break
		}
		if time.Since(killed) > 20*time.Second {
			t.Fatalf("no enqueue on the other node %v after node 0 died: %v", time.Since(killed), err)
		}
	}
	enqueued := time.Since(killed)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for got := false; !got; {
		// "before" may come again: its ack was written, but the node died
		// before it took it (a duplicate, never a loss).
		ds, err = b.Receive(rctx, q, 1, time.Minute)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Receive after the failover: %v %v", ds, err)
		}
		got = string(ds[0].Body) == "2"
		if err := b.Ack(ctx, ds[0]); err != nil {
			t.Fatal(err)
		}
	}
	b.mu.Lock()
	node := b.node
	b.mu.Unlock()
	if node != 1 {
		t.Errorf("connected to node %d after node 0 died, want 1", node)
	}
	t.Logf("node 0 killed: first enqueue after %v, first claim after %v", enqueued.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
}
