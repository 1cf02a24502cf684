package rabbit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

func testURL() string { return testenv.Getenv(URLEnv, DefaultURL) }

// newBackend opens a backend on the machine's broker, or skips (fails under
// CI) when the broker is down.
func newBackend(t testing.TB, cfg Config) *Backend {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = testURL()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := New(ctx, cfg)
	if err != nil {
		testenv.Unreachable(t, "RabbitMQ at "+redact(cfg.URL), err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// queueName derives a fresh queue name from the test's name and deletes its
// broker queues when the test ends.
func queueName(t testing.TB, b *Backend) string {
	t.Helper()
	var r [4]byte
	rand.Read(r[:])
	name := unsafeChars.ReplaceAllString(t.Name(), "_")
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	q := name + "-" + hex.EncodeToString(r[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.DeleteQueue(ctx, q); err != nil && !errors.Is(err, driver.ErrClosed) {
			t.Errorf("delete queue %q: %v", q, err)
		}
	})
	return q
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestDriverBasics walks the driver primitives once on the real broker. The
// behaviour contract is checked by TestConformance; this covers the
// RabbitMQ-specific parts (delivery counts, delay hops, dead-letter queue).
func TestDriverBasics(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	body := []byte{0, 1, 2, 0xff}
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "a", Body: body}}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 5, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || string(ds[0].Body) != string(body) || ds[0].Deliveries != 1 {
		t.Fatalf("got %+v", ds[0])
	}
	// Abandon it by closing a second backend? Here: requeue with a delay.
	start := time.Now()
	if err := b.Requeue(ctx, ds[0], driver.Message{ID: "a.1", Body: []byte("two"), NotBefore: start.Add(300 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	if err := b.Ack(ctx, ds[0]); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second settle: %v, want ErrLeaseLost", err)
	}
	ds, err = b.Receive(ctx, q, 5, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("delayed message came after %v, before its NotBefore", el)
	}
	if string(ds[0].Body) != "two" || ds[0].Deliveries != 1 {
		t.Fatalf("got %q deliveries %d", ds[0].Body, ds[0].Deliveries)
	}
	if err := b.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: "a", Body: []byte("rec")}); err != nil {
		t.Fatal(err)
	}
	recs, next, err := b.ListDead(ctx, q, "", 10)
	if err != nil || len(recs) != 1 || next != "" || recs[0].ID != "a" {
		t.Fatalf("ListDead: %v %q %v", recs, next, err)
	}
	dd, err := b.NextDead(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
		t.Fatalf("second NextDead: %v", err)
	}
	if err := b.SettleDead(ctx, dd, false); err != nil {
		t.Fatal(err)
	}
	st, err := b.Stats(ctx, q)
	if err != nil || st.Dead != 1 {
		t.Fatalf("Stats: %+v %v", st, err)
	}
	if n, err := b.PurgeDead(ctx, q); err != nil || n != 1 {
		t.Fatalf("PurgeDead: %d %v", n, err)
	}
}

// TestCrashCounted closes the backend that holds a delivery; the broker
// returns it at once with x-delivery-count 1.
func TestCrashCounted(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "c", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	b2 := newBackend(t, Config{})
	ds, err := b2.Receive(ctx, q, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b2.Close()
	if err := b2.Ack(ctx, ds[0]); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Ack after Close: %v", err)
	}
	ds, err = b.Receive(ctx, q, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Deliveries != 2 {
		t.Fatalf("Deliveries %d, want 2", ds[0].Deliveries)
	}
	if err := b.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
}

// TestIncompatibleQueue declares a queue that exists as a classic queue.
func TestIncompatibleQueue(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	ctx := testCtx(t)
	q := queueName(t, b)
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(b.workName(q), true, false, false, false, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = b.Declare(ctx, q)
	if !errors.Is(err, ErrIncompatibleQueue) || !strings.Contains(err.Error(), "x-queue-type") || !strings.Contains(err.Error(), b.workName(q)) {
		t.Fatalf("Declare: %v", err)
	}
	t.Log(err)
}

// TestReconnectStaleReceipt cuts the connection under a held delivery: its
// receipt is lease-lost afterwards (never acking the redelivered copy, which
// has the same tag on the new channel), and the backend recovers by itself.
func TestReconnectStaleReceipt(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, u.Host)
	b := newBackend(t, Config{URL: px.url(t, testURL()), ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "r", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	px.cut()
	ds2, err := b.Receive(ctx, q, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ds2[0].Deliveries != 2 {
		t.Fatalf("Deliveries after the cut: %d, want 2", ds2[0].Deliveries)
	}
	for _, f := range []func() error{
		func() error { return b.Ack(ctx, ds[0]) },
		func() error { return b.Extend(ctx, ds[0], time.Second) },
		func() error { return b.Requeue(ctx, ds[0], driver.Message{ID: "r.1"}) },
		func() error { return b.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: "r"}) },
	} {
		if err := f(); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("settle of the stale receipt: %v, want ErrLeaseLost", err)
		}
	}
	if err := b.Ack(ctx, ds2[0]); err != nil {
		t.Fatal(err)
	}
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "s", Body: []byte("y")}}); err != nil {
		t.Fatal(err)
	}
}

// TestReceiveCancelHandsBack checks that a cancelled Receive leaves nothing
// buffered in the backend: prefetched messages nobody was given go back
// uncounted, while the delivery handed out stays held.
func TestReceiveCancelHandsBack(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{Prefetch: 5})
	ctx := testCtx(t)
	q := queueName(t, b)
	var msgs []driver.Message
	for i := range 5 {
		msgs = append(msgs, driver.Message{ID: fmt.Sprint(i), Body: []byte{byte(i)}})
	}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
	held, err := b.Receive(ctx, q, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Receive(cctx, q, 5, time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive on a cancelled context: %v", err)
	}
	b2 := newBackend(t, Config{})
	got := 0
	for got < 4 {
		ds, err := b2.Receive(ctx, q, 4, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.Deliveries != 1 {
				t.Errorf("message %v: Deliveries %d, want 1", d.Body, d.Deliveries)
			}
			if err := b2.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
			got++
		}
	}
	if err := b.Ack(ctx, held[0]); err != nil {
		t.Fatalf("ack of the delivery held across the cancel: %v", err)
	}
}

// TestOpenURL opens the backend through the platform's scheme registry.
func TestOpenURL(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	be, err := asyncplatform.Open(ctx, testURL()+"?prefix=openurl&prefetch=7")
	if err != nil {
		testenv.Unreachable(t, "RabbitMQ at "+redact(testURL()), err)
	}
	defer be.Close()
	b := be.(*Backend)
	if b.cfg.Prefix != "openurl" || b.cfg.Prefetch != 7 {
		t.Fatalf("Prefix %q Prefetch %d, want openurl 7", b.cfg.Prefix, b.cfg.Prefetch)
	}
	if _, err := asyncplatform.Open(ctx, "amqp://guest:secret@127.0.0.1:5672/?prefetch=x"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("bad prefetch: %v", err)
	}
}

// TestBlockedConnection plays a broker alarm through the proxy
// (connection.blocked, then no reading): Enqueue fails with ErrBlocked after
// Config.BlockedTimeout instead of hanging, and works again once unblocked.
func TestBlockedConnection(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, u.Host)
	b := newBackend(t, Config{URL: px.url(t, testURL()), BlockedTimeout: 200 * time.Millisecond})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	px.block("low on memory (test)")
	for !b.isBlocked() {
		time.Sleep(5 * time.Millisecond) // until the client has read the frame
	}
	err = b.Enqueue(ctx, q, []driver.Message{{ID: "b1", Body: []byte("x")}})
	if !errors.Is(err, ErrBlocked) || !strings.Contains(err.Error(), "low on memory") {
		t.Fatalf("Enqueue while blocked: %v, want ErrBlocked", err)
	}
	px.unblock()
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "b2", Body: []byte("y")}}); err != nil {
		t.Fatalf("Enqueue after unblock: %v", err)
	}

	// The alarm starts while a publish waits for its confirm.
	px.pause()
	errc := make(chan error, 1)
	go func() { errc <- b.Enqueue(ctx, q, []driver.Message{{ID: "b3", Body: []byte("z")}}) }()
	time.Sleep(50 * time.Millisecond)
	px.block("disk alarm (test)")
	if err := <-errc; !errors.Is(err, ErrBlocked) {
		t.Fatalf("Enqueue blocked while waiting for its confirm: %v, want ErrBlocked", err)
	}
	px.unblock()
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "b4", Body: []byte("w")}}); err != nil {
		t.Fatalf("Enqueue after the second unblock: %v", err)
	}
}

// TestDeadQueueOrder checks the order of the dead-letter queue, which a
// quorum queue does not keep (TestQuorumRequeueFact) and the backend keeps
// in a header: a listing changes nothing, a kept record stays the oldest,
// and deletes and pops leave the others in order.
func TestDeadQueueOrder(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "m"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		ds, err := b.Receive(ctx, q, 1, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: fmt.Sprint(i), Body: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
		if i < 4 {
			if err := b.Enqueue(ctx, q, []driver.Message{{ID: "m"}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	list := func() string {
		var ids []string
		for cursor := ""; ; {
			recs, next, err := b.ListDead(ctx, q, cursor, 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				ids = append(ids, r.ID)
			}
			if next == "" {
				return strings.Join(ids, ",")
			}
			cursor = next
		}
	}
	if got := list(); got != "0,1,2,3,4" {
		t.Fatalf("listing: %s", got)
	}
	if got := list(); got != "0,1,2,3,4" {
		t.Fatalf("second listing: %s", got)
	}
	dd, err := b.NextDead(ctx, q)
	if err != nil || dd.ID != "0" {
		t.Fatalf("NextDead: %v %v", dd, err)
	}
	if err := b.SettleDead(ctx, dd, false); err != nil {
		t.Fatal(err)
	}
	if n, err := b.DeleteDead(ctx, q, []string{"1", "3", "nope"}); err != nil || n != 2 {
		t.Fatalf("DeleteDead: %d %v", n, err)
	}
	if got := list(); got != "0,2,4" {
		t.Fatalf("listing after keep and delete: %s", got)
	}
	dd, err = b.NextDead(ctx, q)
	if err != nil || dd.ID != "0" {
		t.Fatalf("NextDead after keep: %v %v", dd, err)
	}
	if err := b.SettleDead(ctx, dd, true); err != nil {
		t.Fatal(err)
	}
	if err := b.SettleDead(ctx, dd, true); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second SettleDead: %v", err)
	}
	if got := list(); got != "2,4" {
		t.Fatalf("listing after pop: %s", got)
	}
}

func (b *Backend) isBlocked() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.blocked != nil
}

// TestFailedRequeueHandsBack: a Requeue or DeadLetter whose new copy could
// not be confirmed must not leave the delivery held on its channel, which
// lives as long as the worker: the platform never settles a delivery twice,
// so it would come back only when the worker stops (the fault suite's
// RejectStorm lost jobs so when a new quorum delay queue nacked the first
// publishes). It must come back at once, counted. (The copy, published
// with a context that was already cancelled, may have been written too: a
// duplicate, never a loss.)
func TestFailedRequeueHandsBack(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "a", Body: []byte("orig")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	d := ds[0]
	fails := []func(ctx context.Context, d *driver.Delivery) error{
		func(ctx context.Context, d *driver.Delivery) error {
			return b.Requeue(ctx, d, driver.Message{ID: "a.1", Body: []byte("copy")})
		},
		func(ctx context.Context, d *driver.Delivery) error {
			return b.DeadLetter(ctx, d, driver.DeadMessage{ID: "a.dead", Body: []byte("copy")})
		},
	}
	for i, fail := range fails {
		if d.Deliveries != i+1 {
			t.Fatalf("before failed settle %d: Deliveries %d, want %d", i, d.Deliveries, i+1)
		}
		done, cancel := context.WithCancel(ctx)
		cancel()
		if err := fail(done, d); err == nil {
			t.Fatalf("settle %d with a cancelled context succeeded", i)
		}
		if err := b.Ack(ctx, d); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("ack after failed settle %d: %v, want ErrLeaseLost (handed back)", i, err)
		}
		d = nil
		for deadline := time.Now().Add(3 * time.Second); d == nil && time.Now().Before(deadline); {
			rctx, rcancel := context.WithTimeout(ctx, time.Until(deadline))
			back, _ := b.Receive(rctx, q, 1, time.Minute)
			rcancel()
			for _, m := range back {
				if string(m.Body) == "orig" {
					d = m
				} else if err := b.Ack(ctx, m); err != nil { // a copy written after all
					t.Fatal(err)
				}
			}
		}
		if d == nil {
			t.Fatalf("after failed settle %d the delivery did not come back within 3s", i)
		}
		if d.Deliveries != i+2 {
			t.Fatalf("back after failed settle %d with Deliveries %d, want %d (counted)", i, d.Deliveries, i+2)
		}
	}
	if err := b.Ack(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// TestURLDefault: an empty Config.URL takes $ASYNCPLATFORM_AMQP_URL
// (URLEnv), then DefaultURL; a URL that is set is kept.
func TestURLDefault(t *testing.T) {
	for _, tc := range []struct{ env, url, want string }{
		{"", "", DefaultURL},
		{"amqp://env:5672/", "", "amqp://env:5672/"},
		{"amqp://env:5672/", "amqp://set:5672/", "amqp://set:5672/"},
	} {
		t.Setenv(URLEnv, tc.env)
		if got := (Config{URL: tc.url}).withDefaults().URL; got != tc.want {
			t.Errorf("URL %q with $%s=%q: defaults to %q, want %q", tc.url, URLEnv, tc.env, got, tc.want)
		}
	}
}
