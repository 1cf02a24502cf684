package azure

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"

	"github.com/asyncplatform/asyncplatform/driver"
)

// lostAnswer sends requests on, but for the first message delete it drops
// the service's answer and returns a transport error, as a connection reset
// after the service applied the request would.
type lostAnswer struct {
	next    http.RoundTripper
	dropped atomic.Bool
}

var errInjected = errors.New("injected: connection reset after the service answered")

func (l *lostAnswer) Do(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err == nil && req.Method == http.MethodDelete && strings.Contains(strings.ToLower(req.URL.RawQuery), "popreceipt") && l.dropped.CompareAndSwap(false, true) {
		resp.Body.Close()
		return nil, errInjected
	}
	return resp, err
}

// lostAnswerBackend is a backend whose first message delete loses its
// answer after the service applied it; the SDK then retries it.
func lostAnswerBackend(t *testing.T) (*Backend, *lostAnswer) {
	t.Helper()
	cfg := testConfig(t, Config{})
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.IdleConnTimeout = 2 * time.Second
	lost := &lostAnswer{next: tr}
	cfg.ClientOptions = &azqueue.ClientOptions{ClientOptions: azcore.ClientOptions{
		Transport: lost,
		Retry:     policy.RetryOptions{RetryDelay: 10 * time.Millisecond},
	}}
	b, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, lost
}

// TestAckAnswerLost: an Ack whose delete was applied by the service but
// whose answer was lost (the SDK's retry, with the same pop receipt, finds
// the message gone) has acked the job: it returns nil, not ErrLeaseLost,
// and the job does not come back.
func TestAckAnswerLost(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	if err := b.Enqueue(ctx, q, []driver.Message{{Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	lossy, lost := lostAnswerBackend(t)
	ds, err := lossy.Receive(ctx, q, 1, 2*time.Second)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d deliveries, %v", len(ds), err)
	}
	if err := lossy.Ack(ctx, ds[0]); err != nil {
		t.Errorf("Ack whose first try was applied and its answer lost: %v, want nil", err)
	}
	if !lost.dropped.Load() {
		t.Fatal("no delete answer was dropped")
	}
	// The message is gone: nothing comes back after its lease.
	rctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	if ds, err := b.Receive(rctx, q, 1, time.Second); len(ds) != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("after the Ack: %d deliveries, %v; want none", len(ds), err)
	}
}

// TestAckStaleAfterRetry: a delete with a pop receipt the message no longer
// has (it was received again), whose first answer is lost and retried,
// still fails: only MessageNotFound after a retry counts as deleted.
func TestAckStaleAfterRetry(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	if err := b.Enqueue(ctx, q, []driver.Message{{Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1, time.Second)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d deliveries, %v", len(ds), err)
	}
	r := ds[0].Handle.(*receipt)
	pop, _, _ := r.current(ctx)
	// Another worker takes the message after the lease.
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	again, err := b.Receive(rctx, q, 1, time.Minute)
	if err != nil || len(again) != 1 {
		t.Fatalf("second Receive: %d deliveries, %v", len(again), err)
	}
	// A delete with the old receipt whose try was retried finds another
	// receipt: not deleted.
	lossy, _ := lostAnswerBackend(t)
	old := &receipt{b: lossy, q: lossy.svc.NewQueueClient(lossy.names(q).work), id: r.id}
	if err := old.deleteMessage(ctx, pop); err == nil {
		t.Fatal("a delete with a stale pop receipt succeeded")
	}
	if err := b.Ack(ctx, again[0]); err != nil {
		t.Errorf("Ack of the live delivery: %v", err)
	}
}
