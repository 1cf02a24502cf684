package azure

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"

	"github.com/asyncplatform/asyncplatform/driver"
)

// slowService delays the queue service's dequeues and message updates, as
// Azurite answers at depth (its dequeue walks every message of the account:
// TestAzuriteDequeueCostFact) or on a loaded machine.
type slowService struct {
	next            http.RoundTripper
	dequeue, update time.Duration
}

func (s slowService) Do(req *http.Request) (*http.Response, error) {
	q := strings.ToLower(req.URL.RawQuery)
	switch {
	case req.Method == http.MethodGet && strings.Contains(q, "numofmessages") && !strings.Contains(q, "peekonly"):
		time.Sleep(s.dequeue)
	case req.Method == http.MethodPut && strings.Contains(q, "popreceipt"):
		time.Sleep(s.update)
	}
	return s.next.RoundTrip(req)
}

// TestCancelledReceiveHandsBackAll: a Receive whose ctx ends while its
// request is in flight hands back every message it took, uncounted and
// visible at once, even when each update is slow: the updates run in
// parallel, each with its own timeout. (Run one after another within one
// 30 s budget at 1.2 s an update, the messages past the 25th would come
// back only after their lease, with a crash counted.)
func TestCancelledReceiveHandsBackAll(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	const n = 32
	msgs := make([]driver.Message, n)
	for i := range msgs {
		msgs[i] = driver.Message{Body: []byte{byte(i)}}
	}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, Config{})
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.IdleConnTimeout = 2 * time.Second
	cfg.ClientOptions = &azqueue.ClientOptions{ClientOptions: azcore.ClientOptions{
		Transport: slowService{next: tr, dequeue: time.Second, update: 1200 * time.Millisecond}}}
	slow, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := slow.Receive(rctx, q, n, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive: %v, want context.DeadlineExceeded", err)
	}
	t.Logf("the cancelled Receive returned after %v", time.Since(start).Round(time.Millisecond))
	got := map[byte]int{}
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		ds, err := b.Receive(rctx, q, n, time.Minute)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		for _, d := range ds {
			got[d.Body[0]] = d.Deliveries
			if err := b.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(got) != n {
		t.Fatalf("%d of %d messages handed back (the rest are hidden for their lease)", len(got), n)
	}
	for i, c := range got {
		if c != 1 {
			t.Errorf("message %d: Deliveries %d after the hand-back, want 1 (uncounted)", i, c)
		}
	}
}
