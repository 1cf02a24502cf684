package rabbit

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestDelaySweep: a message stuck in a delay queue past its due time (here
// in the largest step, whose TTL is 29 hours, with a due time an hour ago)
// is moved to the work queue by the sweeper of a Backend consuming the
// queue, uncounted; the message behind it, not due, stays scheduled.
func TestDelaySweep(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{DelaySweep: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	k := numSteps - 1
	for _, m := range []struct {
		id  string
		due time.Time
	}{{"stuck", time.Now().Add(-time.Hour)}, {"later", time.Now().Add(step(k))}} {
		out, err := b.delayed(ctx, q, amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: m.id, Body: []byte(m.id)}, step(k))
		if err != nil {
			t.Fatal(err)
		}
		out.pub.Headers[dueHeader] = m.due.UnixMilli()
		if err := b.publish(ctx, out); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := b.Receive(ctx, q, 10, time.Minute)
	if err != nil {
		st, _ := b.Stats(ctx, q)
		t.Fatalf("the stuck message never came: %v (Stats %s)", err, fmtStats(st))
	}
	if len(ds) != 1 || string(ds[0].Body) != "stuck" || ds[0].Deliveries != 1 {
		for _, d := range ds {
			t.Errorf("received %q, deliveries %d", d.Body, d.Deliveries)
		}
		t.Fatalf("want the stuck message alone, uncounted")
	}
	if err := b.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
	// A few more sweeps: the message not due stays scheduled.
	rctx, rcancel := context.WithTimeout(ctx, time.Second)
	defer rcancel()
	if ds, err := b.Receive(rctx, q, 10, time.Minute); err == nil {
		t.Fatalf("received %d messages (the first %q) before they were due", len(ds), ds[0].Body)
	}
	if st, err := b.Stats(ctx, q); err != nil || st.Scheduled != 1 {
		t.Errorf("Stats = %s, %v; want the later message scheduled", fmtStats(st), err)
	}
}

func fmtStats(st driver.Stats) string {
	return fmt.Sprintf("Ready %d, Scheduled %d, Dead %d", st.Ready, st.Scheduled, st.Dead)
}
