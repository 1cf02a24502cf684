package rabbit

import (
	"context"
	"log/slog"
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestTwinOfHeldDropped: a producer's publish reaches the broker, the
// proxy swallows its confirm and the connection is cut, so the producer
// sends it again on its next connection and the queue stores two messages
// of one instance (as an Enqueue at a node's kill did in
// TestCluster/NodeKill). A worker that holds one of them must not be
// handed the other: the job would run twice. The twin must be acked, and
// the held one, once acked, leave the queue empty.
func TestTwinOfHeldDropped(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, u.Host)
	quiet := slog.New(slog.DiscardHandler)
	w := newBackend(t, Config{Logger: quiet})
	prod := newBackend(t, Config{
		URL: px.url(t, testURL()), PublishTimeout: 30 * time.Second,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond, Logger: quiet,
	})
	ctx := testCtx(t)
	q := queueName(t, w)
	if err := w.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := prod.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	px.dropConfirms.Store(true)
	enqueued := make(chan error, 1)
	go func() { enqueued <- prod.Enqueue(ctx, q, []driver.Message{{ID: "twin", Body: []byte("x")}}) }()
	deadline := time.Now().Add(30 * time.Second)
	for px.dropped.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no confirm of the publish came in 30s")
		}
		time.Sleep(time.Millisecond)
	}
	px.cut()
	px.dropConfirms.Store(false)
	if err := <-enqueued; err != nil {
		t.Fatalf("Enqueue after the cut: %v", err)
	}
	for {
		st, err := w.Stats(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats %+v: want the two stored messages of the publish sent twice", st)
		}
		time.Sleep(10 * time.Millisecond)
	}

	ds, err := w.Receive(ctx, q, 2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if more, err := w.Receive(rctx, q, 2, time.Minute); err == nil {
		ds = append(ds, more...)
	}
	if len(ds) != 1 {
		t.Fatalf("%d deliveries of one publish handed out while the first was held: its job runs twice", len(ds))
	}
	if err := w.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
	st, err := w.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 {
		t.Errorf("Stats %+v after the ack: the twin was not acked", st)
	}
}

// TestHeldLostNotTwin: a delivery held on a connection that is cut comes
// back to the same Backend, counted; it is the same stored message, not a
// twin, and must be handed out again.
func TestHeldLostNotTwin(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, u.Host)
	w := newBackend(t, Config{
		URL: px.url(t, testURL()), ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	ctx := testCtx(t)
	q := queueName(t, w)
	if err := w.Enqueue(ctx, q, []driver.Message{{ID: "held", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := w.Receive(ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	px.cut()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	again, err := w.Receive(rctx, q, 1, time.Minute)
	if err != nil {
		t.Fatalf("the delivery held on the cut connection did not come back within 30s (%v): lost", err)
	}
	if again[0].Deliveries != 2 {
		t.Errorf("back with Deliveries %d, want 2", again[0].Deliveries)
	}
	if err := w.Ack(ctx, ds[0]); err == nil {
		t.Error("the Ack of the delivery of the cut connection succeeded")
	}
	if err := w.Ack(ctx, again[0]); err != nil {
		t.Fatal(err)
	}
}

// TestEnqueueRetryTwinDropped: an Enqueue's publish reaches the broker,
// the proxy swallows its confirm and the Enqueue fails when its ctx ends;
// the caller enqueues the job again, and the queue stores two messages of
// it (as a retried Enqueue at a node's kill may in TestCluster/NodeKill).
// The second must go under the first one's instance, so that a worker
// holding one is not handed the other.
func TestEnqueueRetryTwinDropped(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, u.Host)
	quiet := slog.New(slog.DiscardHandler)
	w := newBackend(t, Config{Logger: quiet})
	prod := newBackend(t, Config{URL: px.url(t, testURL()), Logger: quiet})
	ctx := testCtx(t)
	q := queueName(t, w)
	if err := w.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := prod.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	msg := []driver.Message{{ID: "retried", Body: []byte("x")}}
	px.dropConfirms.Store(true)
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err = prod.Enqueue(cctx, q, msg)
	cancel()
	if err == nil {
		t.Fatal("Enqueue succeeded with its confirm swallowed")
	}
	px.dropConfirms.Store(false)
	if err := prod.Enqueue(ctx, q, msg); err != nil {
		t.Fatalf("Enqueue tried again: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := w.Stats(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats %+v: want the two stored messages of the job enqueued twice", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ds, err := w.Receive(ctx, q, 2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
	defer rcancel()
	if more, err := w.Receive(rctx, q, 2, time.Minute); err == nil {
		ds = append(ds, more...)
	}
	if len(ds) != 1 {
		t.Fatalf("%d deliveries of a job whose failed Enqueue was tried again handed out while the first was held: it runs twice", len(ds))
	}
	if err := w.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}

	// Enqueued once more, after the Enqueue that succeeded: a new message,
	// not a twin of the acked one.
	if err := prod.Enqueue(ctx, q, msg); err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	defer acancel()
	again, err := w.Receive(actx, q, 1, time.Minute)
	if err != nil {
		t.Fatalf("the job enqueued again after a successful Enqueue was not handed out (%v): taken for a twin of the acked one", err)
	}
	if err := w.Ack(ctx, again[0]); err != nil {
		t.Fatal(err)
	}
}

// TestTwinCopyDropped: two stored messages of one publish; a worker holds
// one while the other sits in its consumer's buffer, and a release hands
// that one back as a copy with an instance of its own. The copy must not
// be handed out while its twin is held, nor after the twin was acked; the
// release's copies of other messages must still be.
func TestTwinCopyDropped(t *testing.T) {
	t.Parallel()
	w := newBackend(t, Config{Prefetch: 5, Logger: slog.New(slog.DiscardHandler)})
	ctx := testCtx(t)
	q := queueName(t, w)
	if err := w.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	inst := newInstance()
	publishRaw(t, w, q, "twin", amqp.Table{instanceHeader: inst})
	publishRaw(t, w, q, "twin", amqp.Table{instanceHeader: inst})
	publishRaw(t, w, q, "other", amqp.Table{instanceHeader: newInstance()})
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := w.Stats(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats %+v: want 3 messages", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ds, err := w.Receive(ctx, q, 1, time.Minute) // the first twin held, the rest buffered
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	w.Receive(cctx, q, 5, time.Minute) // releases: hands back what is buffered

	var got []*driver.Delivery
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	for {
		more, err := w.Receive(rctx, q, 5, time.Minute)
		if err != nil {
			break
		}
		got = append(got, more...)
	}
	ids := map[string]int{}
	for _, d := range got {
		ids[string(d.Body)]++
		if err := w.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 1 || ids["other"] != 1 {
		t.Fatalf("handed out after the release, while a twin was held: %v; want the other message alone", ids)
	}
	if err := w.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}

	// A copy of a twin arriving after its sibling was acked.
	publishRaw(t, w, q, "twin", amqp.Table{instanceHeader: newInstance(), originHeader: inst})
	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	defer acancel()
	if again, err := w.Receive(actx, q, 1, time.Minute); err == nil {
		t.Fatalf("a copy of a twin of an acked message was handed out (body %q): its job runs twice", again[0].Body)
	}
	st, err := w.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 {
		t.Errorf("Stats %+v: the twins were not acked", st)
	}
}
