package rabbit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestReleaseAcksApplied: a released consumer hands back what it buffered
// as copies and acks the originals; every original must stay acked when
// the channel closes right after. RabbitMQ 3.10 holds a channel's settles
// to a quorum queue back once about 32 commands are unapplied and drops
// them when the channel closes: acked one by one, 27 of 60 originals came
// back with a delivery counted, beside their copies (on one node and on
// the cluster; 33 were applied, as in TestDeleteDeadAcksApplied).
func TestReleaseAcksApplied(t *testing.T) {
	t.Parallel()
	const n = 60
	b := newBackend(t, Config{Prefetch: n})
	ctx := testCtx(t)
	q := queueName(t, b)
	var msgs []driver.Message
	for i := range n {
		msgs = append(msgs, driver.Message{ID: fmt.Sprint(i), Body: []byte(fmt.Sprint(i))})
	}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	// Starts a consumer and releases it at once: it collects the window,
	// hands it back, and closes its channel.
	if _, err := b.Receive(cctx, q, n, time.Minute); err == nil {
		t.Fatal("Receive on a cancelled context succeeded")
	}

	b2 := newBackend(t, Config{})
	seen := map[string]int{}
	counted := 0
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		got, _ := b2.Receive(rctx, q, n, time.Minute)
		cancel()
		if len(got) == 0 {
			break
		}
		for _, d := range got {
			seen[string(d.Body)]++
			if d.Deliveries != 1 {
				counted++
			}
			if err := b2.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	dups := 0
	for _, c := range seen {
		dups += c - 1
	}
	if len(seen) != n || dups > 0 || counted > 0 {
		t.Errorf("after the release: %d of the %d messages left, %d duplicates, %d with a delivery counted; want each once, uncounted", len(seen), n, dups, counted)
	}
}
