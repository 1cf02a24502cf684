package rabbit

import (
	"context"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestEnqueueEndedContextStoresNothing: an Enqueue whose ctx has ended
// fails and stores nothing: the publish is not sent, so no confirm races
// the ended ctx (which would return an error for a stored message, and let
// a settle under a cancelled ctx succeed when the confirm won).
func TestEnqueueEndedContextStoresNothing(t *testing.T) {
	b := newBackend(t, Config{})
	q := queueName(t, b)
	ctx := testCtx(t)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.Enqueue(ended, q, []driver.Message{{ID: "m", Body: []byte("x")}}); err == nil {
		t.Fatal("Enqueue under an ended ctx succeeded")
	}
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	defer rcancel()
	if ds, _ := b.Receive(rctx, q, 1, time.Minute); len(ds) > 0 {
		t.Errorf("Enqueue under an ended ctx failed, but stored the message: %q came back", ds[0].Body)
	}
}
