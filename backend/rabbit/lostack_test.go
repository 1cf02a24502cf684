package rabbit

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestLostAckNotRunAgain: an Ack is written, the proxy swallows it (as a
// node killed before applying it would), and the connection is cut. The
// queue hands the message out again, counted; the Backend that acked it
// must drop it (ack it) instead of handing it out, with no store. The
// message must then be gone from the queue.
func TestLostAckNotRunAgain(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, u.Host)
	direct := newBackend(t, Config{})
	w := newBackend(t, Config{
		URL: px.url(t, testURL()), ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	ctx := testCtx(t)
	q := queueName(t, direct)
	if err := direct.Enqueue(ctx, q, []driver.Message{{ID: "done", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := w.Receive(ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	px.dropAcks.Store(true)
	if err := w.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for px.dropped.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the ack frame did not reach the proxy in 30s")
		}
		time.Sleep(time.Millisecond)
	}
	px.cut()
	px.dropAcks.Store(false)

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	again, err := w.Receive(rctx, q, 1, time.Minute)
	if err == nil {
		t.Fatalf("a message whose ack was lost with its connection was handed out again (Deliveries %d): its job runs twice", again[0].Deliveries)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	// The redelivery was dropped by an ack, not left somewhere: nothing is
	// left for another consumer once w is gone.
	w.Close()
	rctx2, cancel2 := context.WithTimeout(ctx, 3*time.Second)
	defer cancel2()
	if left, err := direct.Receive(rctx2, q, 1, time.Minute); err == nil {
		t.Fatalf("the message is still in the queue (Deliveries %d): its redelivery was not dropped within 10s", left[0].Deliveries)
	}
}

// TestDoubtSetBounded: the doubtful acks expire after doubtTTL and never
// exceed doubtMax.
func TestDoubtSetBounded(t *testing.T) {
	var s doubtSet
	t0 := time.Now()
	s.add(t0, []string{"a"})
	if !s.has(t0.Add(doubtTTL-time.Second), "a") || s.has(t0.Add(doubtTTL+time.Second), "a") {
		t.Error("a doubtful ack must be known for doubtTTL, then no more")
	}
	many := make([]string, doubtMax+10)
	for i := range many {
		many[i] = string(rune('A'+i%26)) + string(rune(i))
	}
	s.add(t0, many)
	if n := len(s.until); n > doubtMax || len(s.order) > doubtMax {
		t.Errorf("%d doubtful acks kept (%d in order), at most %d", n, len(s.order), doubtMax)
	}
	if !s.has(t0, many[len(many)-1]) {
		t.Error("the newest doubtful ack was dropped")
	}
	s.add(t0.Add(doubtTTL+time.Minute), []string{"z"})
	if len(s.until) != 1 {
		t.Errorf("%d doubtful acks kept after all others expired, want 1", len(s.until))
	}
}

// TestTwinOfAckedDropped: one publish stored twice (an Enqueue whose
// confirm was lost with a killed node is sent again, and both copies are
// stored: the likely cause of TestCluster/NodeKill's duplicate of the job
// enqueued at the kill) carries one instance. Once a Backend acked one
// copy, it drops the other, unhanded, and acks it.
func TestTwinOfAckedDropped(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{Logger: slog.New(slog.DiscardHandler)})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	inst := newInstance()
	publishRaw(t, b, q, "twin", amqp.Table{instanceHeader: inst})
	publishRaw(t, b, q, "twin", amqp.Table{instanceHeader: inst})
	ds, err := b.Receive(ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if again, err := b.Receive(rctx, q, 1, time.Minute); err == nil {
		t.Fatalf("the twin of a message this Backend acked was handed out (Deliveries %d): its job runs twice", again[0].Deliveries)
	}
	st, err := b.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 {
		t.Errorf("Stats %+v: the twin was not acked", st)
	}
}
